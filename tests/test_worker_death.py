"""A worker whose own thread dies: the jobs it is running must not run twice at once."""

import signal

import pytest
from django.db import connection

from axa_django.worker.control import Control
from axa_django.worker.signalling import Signals
from tests.conftest import AXA_APPS, wait_for
from tests.test_reliability import fresh, lease, lines
from tests.testapp import hostile_jobs, jobs

EXCLUSIVE = "tests.testapp.hostile_jobs.exclusive"


def listening(count: int) -> bool:
    """``count`` workers' listeners have run their LISTEN: a row given back now is claimed at once.

    A listener runs LISTEN right after its connection's set-up (which reads ``pg_is_in_recovery()``);
    any statement after that one says it has. Not ``LISTEN`` itself: the fleet's poller's listener
    goes on to look for rows fallen due (a flake in CI's embedded leg).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'axa_django listener' AND query <> '' "
            "AND query NOT LIKE '%%pg_is_in_recovery()%%'"
        )
        return cursor.fetchone()[0] >= count


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize(
    ("thread", "said", "name"),
    [
        ("MainThread", "the dispatcher failed; stopping the worker once its jobs", "dispatcher"),
        ("axa-listener", "worker thread axa-listener died; stopping the worker once its jobs", "axa-listener"),
    ],
    ids=["dispatcher", "listener"],
)
def test_a_dead_dispatcher_or_listener_lets_the_running_job_finish_and_no_other_worker_starts_it(
    workers, log_file, thread, said, name
):
    # Two leases: the heartbeat must go on renewing its lease, or the rescue hands it to the second worker.
    slow = hostile_jobs.exclusive.perform_later(2 * lease(), log_file)
    first = workers.start("--concurrency", "2")
    wait_for(lambda: lines(log_file), what="the slow job's start")
    # It runs only the slow job: any start of it there is a second run.
    second = workers.start("--concurrency", "1", "--job", EXCLUSIVE)
    wait_for(lambda: listening(2), what="both workers listening")
    hostile_jobs.kill_thread.perform_later(thread)
    assert first.wait(timeout=60) == 1
    output = first.stdout.read()
    wait_for(lambda: fresh(slow).status in ("completed", "failed"), what="the slow job's outcome")
    # Before the fix: ["start A alone", "start B overlap", "end B"]: the row was given back while
    # the first worker's thread still ran it, and the second worker started it again at once.
    assert lines(log_file) == [f"start {first.pid} alone", f"end {first.pid}"], (lines(log_file), output)
    assert said in output and f"stopped because its {name} thread died" in output, output
    row = fresh(slow)
    assert (row.status, row.attempts, row.errors) == ("completed", 1, []), (row.status, row.errors)
    assert second.poll() is None


def test_a_thread_the_jobs_do_not_need_dying_stops_as_a_first_signal_and_a_second_signal_aborts():
    control = Control()
    signals = Signals(control)
    control.fail("dispatcher")
    assert control.stopping.is_set() and not control.aborting.is_set() and not control.done.is_set()
    signals.handle(signal.SIGTERM)  # the operator's first: finish the jobs, as the worker does already
    assert not control.aborting.is_set()
    signals.handle(signal.SIGTERM)
    assert control.aborting.is_set() and not control.done.is_set()  # the heartbeat beats until the jobs are given back
    assert control.fatal == "dispatcher"


def test_a_thread_the_jobs_do_not_need_dying_is_bounded_by_the_grace_period():
    control = Control(grace=0.05)
    control.fail("axa-listener")
    assert not control.aborting.is_set()
    wait_for(control.aborting.is_set, timeout=10, what="the grace period to abort")
    assert control.fatal == "axa-listener"


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_dispatcher_whose_statements_keep_failing_lets_the_running_job_finish_and_exits_1(workers, log_file):
    # Claims of any job but the slow one break a CHECK the test adds (not a lost connection):
    # the dispatcher fails them for over a lease, then stops; the job it runs must still end
    # completed. The stop's own unregistering fails too (a trigger): it must not raise out of
    # the worker, a traceback without the worker's last line. Polling: no wake-up statement of a
    # listener succeeds between the dispatcher's failures and the stop's.
    slow = hostile_jobs.exclusive.perform_later(2 * lease(), log_file)
    first = workers.start("--concurrency", "2", env=workers.env(AXA_TEST_NOTIFY="0"))
    wait_for(lambda: lines(log_file), what="the slow job's start")
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE axa_queue ADD CONSTRAINT axa_test_no_claims "
            "CHECK (status <> 'running' OR name = %s) NOT VALID",
            [EXCLUSIVE],
        )
        cursor.execute(
            "CREATE FUNCTION axa_test_keep() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'axa_worker rows stay (test)'; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER axa_test_keep BEFORE DELETE ON axa_worker FOR EACH ROW EXECUTE FUNCTION axa_test_keep()"
        )
    try:
        jobs.add.perform_later(1, 2)
        assert first.wait(timeout=60) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE axa_queue DROP CONSTRAINT IF EXISTS axa_test_no_claims")
            cursor.execute("DROP TRIGGER IF EXISTS axa_test_keep ON axa_worker")
            cursor.execute("DROP FUNCTION IF EXISTS axa_test_keep()")
    output = first.stdout.read()
    assert "the dispatcher's statements have failed for over" in output, output
    assert "stopped because its dispatcher thread died" in output, output
    assert lines(log_file) == [f"start {first.pid} alone", f"end {first.pid}"], (lines(log_file), output)
    row = fresh(slow)
    assert (row.status, row.attempts, row.errors) == ("completed", 1, []), (row.status, row.errors)
