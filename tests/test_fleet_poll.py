"""One worker polls for the fleet; the others, told of every change by NOTIFY, poll less often.

The poller is the worker whose heartbeat connection holds ``sql.POLLER_LOCK``. When idle
it looks, every POLL_INTERVAL, for rows that fell due lately and are still queued, and
wakes every worker if there are: rows no trigger announced (written with
session_replication_role = replica, a queue's slot freed by the seed's FINISH, a row a
user held when it fell due) are claimed as soon as before, by whichever worker serves them.
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest
from django.db import connection, transaction

from axa_django import Job
from axa_django.worker.quiet import Quiet
from tests.conftest import AXA_APPS, database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

HOLDER = """
SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE l.locktype = 'advisory' AND l.classid = 178913281 AND l.objid = 1 AND l.objsubid = 2
  AND l.granted AND d.datname = current_database()
"""


def holders() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(HOLDER)
        return [row[0] for row in cursor.fetchall()]


def beaten(count: int) -> bool:
    """``count`` workers registered and each has beaten at least once since."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM axa_worker WHERE heartbeat_at > started_at")
        return cursor.fetchone()[0] >= count


def insert_raw(queue: str, announced: bool = True) -> str:
    """A ready row written by plain SQL; unannounced: as a replica writes it, no trigger fires, no NOTIFY."""
    with transaction.atomic(), connection.cursor() as cursor:
        if not announced:
            cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "INSERT INTO axa_queue (id, name, queue, args) "
            "VALUES (gen_random_uuid(), 'tests.testapp.jobs.add', %s, '{\"a\": 1, \"b\": 2}') RETURNING id",
            [queue],
        )
        return str(cursor.fetchone()[0])


def test_one_worker_polls_for_the_fleet_and_another_takes_over_when_it_dies(workers) -> None:
    first = workers.start("--concurrency", "1")
    wait_for(lambda: len(holders()) == 1, what="the first worker to take the fleet's poll")
    (poller,) = holders()
    others = [workers.start("--concurrency", "1") for _ in range(2)]
    wait_for(lambda: beaten(3), what="all three workers to beat")
    wait_for(lambda: beaten(3) and holders() == [poller], timeout=5, what="the poll to stay with the first")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    (successor,) = wait_for(lambda: (h := holders()) and h != [poller] and h, what="another worker to take the poll")
    assert successor != poller
    assert all(proc.poll() is None for proc in others)
    job_id = insert_raw("default")
    wait_for(lambda: Job.objects.filter(id=job_id, status="completed").exists(), what="the raw row to run")


def test_rows_nobody_announced_are_announced_by_the_idle_poller(workers) -> None:
    # A row of a queue the poller does not serve, written with no trigger: only the
    # poller's look can announce it (to the workers that serve it; here, none).
    workers.start("--concurrency", "1", "--new-queue", "a", env=workers.env(AXA_TEST_POLL="0.5"))
    wait_for(lambda: len(holders()) == 1, what="the worker to take the fleet's poll")
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute("LISTEN axa_queue")
        (dispatcher,) = listener.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'axa_django dispatcher'"
        ).fetchone()
        insert_raw("elsewhere", announced=False)
        wakes: list[int] = []
        deadline = time.monotonic() + 15
        while not wakes and time.monotonic() < deadline:
            notes = listener.notifies(timeout=deadline - time.monotonic(), stop_after=1)
            wakes = [note.pid for note in notes if note.payload == ""]
    assert wakes == [dispatcher], "the poller did not announce the row written without a word"


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
