"""One worker polls for the fleet; the others, told of every change by NOTIFY, poll less often.

The poller is the eldest worker whose heartbeat is within its lease (each beat asks). Every
POLL_INTERVAL, busy or idle, its listener looks for queued rows that fell due since its last
look and wakes every worker if there are: rows no trigger announces (a retry's backoff ending,
rows written with session_replication_role = replica, a slot freed by the seed's FINISH) are
claimed as soon as before, by whichever worker serves them.
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest
from django.db import connection, transaction

from axa_django import Job, queues, sql
from axa_django.worker.quiet import Quiet
from tests.conftest import AXA_APPS, database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

LISTENERS = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name = 'axa_django listener' ORDER BY backend_start"
)


def beaten(count: int) -> bool:
    """``count`` workers registered and each has beaten at least once since."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM axa_worker WHERE heartbeat_at > started_at")
        return cursor.fetchone()[0] >= count


def insert_raw(queue: str, delay: float = 0.0) -> str:
    """A row written as a replica writes it: no trigger fires, so no NOTIFY."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "INSERT INTO axa_queue (id, name, queue, args, run_at) VALUES (gen_random_uuid(), "
            "'tests.testapp.jobs.add', %s, '{\"a\": 1, \"b\": 2}', now() + make_interval(secs => %s)) RETURNING id",
            [queue, delay],
        )
        return str(cursor.fetchone()[0])


def announcer(listener: psycopg.Connection, timeout: float = 15) -> int | None:
    """The pid of the backend that sends the next wake-up ('' on axa_queue), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for note in listener.notifies(timeout=deadline - time.monotonic(), stop_after=1):
            if note.payload == "":
                return note.pid
    return None


@pytest.mark.halved
def test_the_eldest_live_worker_announces_unannounced_rows_and_the_next_takes_over_when_it_dies(workers) -> None:
    # Rows of a queue nobody serves, written with no trigger: only the poller's look announces them.
    env = workers.env(AXA_TEST_LEASE="1.5")  # the dead poller's lease runs out sooner
    first = workers.start("--concurrency", "1", "--new-queue", "a", env=env)
    wait_for(lambda: beaten(1), what="the first worker to beat")
    second = workers.start("--concurrency", "1", "--new-queue", "a", env=env)
    wait_for(lambda: beaten(2), what="both workers to beat")
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN axa_queue")
        eldest, younger = (row[0] for row in listener.execute(LISTENERS))
        insert_raw("elsewhere")
        assert announcer(listener) == eldest
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        # Once the dead one's lease has run out, the survivor's next beat makes it the poller: a
        # row written then falls within its first look.
        deadline, heard = time.monotonic() + 30, None
        while heard != younger and time.monotonic() < deadline:
            insert_raw("nobody's")
            heard = announcer(listener, timeout=2)
        assert heard == younger
    assert second.poll() is None


def test_a_row_falling_due_unannounced_is_announced_while_the_poller_is_busy(workers, tmp_path) -> None:
    # The poller's one thread runs a long job; the row falls due later with no trigger (as a
    # retry's backoff ends): the look runs all the same (it waited for the others' poll).
    env = workers.env(AXA_TEST_POLL="0.5")
    workers.start("--concurrency", "1", "--new-queue", "a", env=env)
    wait_for(lambda: beaten(1), what="the poller to beat")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, queue, args) VALUES (gen_random_uuid(), 'tests.testapp.jobs.slow', "
            "'a', %s) RETURNING id",
            ['{"seconds": 20}'],
        )
    wait_for(lambda: Job.objects.filter(status="running").exists(), what="the poller's thread to be busy")
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN axa_queue")
        (look,) = (row[0] for row in listener.execute(LISTENERS))
        insert_raw("elsewhere", delay=1.0)
        assert announcer(listener) == look


@pytest.mark.parametrize(
    ("poller", "heard_all", "expected"),
    [(None, True, 0.2), (True, True, 10.0), (False, True, 10.0), (False, False, 0.2), (True, False, 0.2)],
)
def test_a_worker_of_a_polled_fleet_that_hears_every_change_claims_at_its_housekeeping_interval(
    poller: bool | None, heard_all: bool, expected: float
) -> None:
    quiet = Quiet()
    quiet.poller, quiet.heard_all = poller, heard_all
    assert quiet.idle_wait(0.2, 10.0) == expected


def test_the_look_announces_a_row_that_fell_due_once_and_never_a_paused_queues() -> None:
    # A paused queue's rows falling due woke the whole fleet at every look (the review's case),
    # and one row woke it at every look of its window.
    queues.pause("held", "test")
    insert_raw("held")
    with psycopg.connect(database_url(), autocommit=True) as look:
        look.execute("LISTEN axa_queue")
        (since,) = look.execute(sql.FLEET_PROBE, {"since": None, "window": 10}).fetchone()[:1]
        assert [n.payload for n in look.notifies(timeout=0.3, stop_after=1)] == []  # the paused queue's row
        insert_raw("open")
        (since,) = look.execute(sql.FLEET_PROBE, {"since": None, "window": 10}).fetchone()[:1]
        assert [n.payload for n in look.notifies(timeout=1, stop_after=1)] == [""]
        look.execute(sql.FLEET_PROBE, {"since": since, "window": 10})
        assert [n.payload for n in look.notifies(timeout=0.3, stop_after=1)] == []  # seen at the last look
