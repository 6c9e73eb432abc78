"""A worker whose own thread dies: the jobs it is running must not run twice at once."""

import pytest
from django.db import connection

from tests.conftest import AXA_APPS, wait_for
from tests.test_reliability import fresh, lines
from tests.testapp import hostile_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

EXCLUSIVE = "tests.testapp.hostile_jobs.exclusive"


def listening(count: int) -> bool:
    """``count`` workers' listeners have run their LISTEN: a row given back now is claimed at once."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'axa_django listener' AND query LIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0] >= count


@pytest.mark.halved
def test_a_dead_dispatcher_lets_the_running_job_finish_and_no_other_worker_starts_it(workers, log_file):
    slow = hostile_jobs.exclusive.perform_later(3, log_file)
    first = workers.start("--concurrency", "2")
    wait_for(lambda: lines(log_file), what="the slow job's start")
    # It runs only the slow job: any start of it there is a second run.
    second = workers.start("--concurrency", "1", "--job", EXCLUSIVE)
    wait_for(lambda: listening(2), what="both workers listening")
    hostile_jobs.kill_thread.perform_later("MainThread")
    assert first.wait(timeout=60) == 1
    output = first.stdout.read()
    assert "the dispatcher failed; stopping the worker" in output, output
    assert "stopped because its dispatcher thread died" in output, output
    wait_for(lambda: fresh(slow).status in ("completed", "failed"), what="the slow job's outcome")
    # Before the fix: ["start A alone", "start B overlap", "end B"]: the row was given back while
    # the first worker's thread still ran it, and the second worker started it again at once.
    assert lines(log_file) == [f"start {first.pid} alone", f"end {first.pid}"], (lines(log_file), output)
    row = fresh(slow)
    assert (row.status, row.attempts, row.errors) == ("completed", 1, []), (row.status, row.errors)
    assert second.poll() is None
