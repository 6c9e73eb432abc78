"""A job whose database connection dies under it is lost to the database, not failed (issue 45).

At the defaults (MAX_ATTEMPTS 1) a server restart failed for good every job whose own
queries died with the connection. Now such an attempt is counted as a dead worker's is:
the row goes back to queued with its attempt given back and a loss counted, so
``max_losses`` bounds a job that ends its own connection every time. An OperationalError
on a connection that still works (a statement_timeout) is the job's own failure, as before.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction

from axa_django import Job, background_job
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

SLEEP = "SELECT pg_sleep(30) /* lost-database test */"


@background_job
def sleeps_the_first_time(marker: str) -> str:
    # The first run waits on the server until the test ends its backend; the next returns.
    if not Path(marker).exists():
        Path(marker).touch()
        with connection.cursor() as cursor:
            cursor.execute(SLEEP)
    return "ran again"


@background_job(max_losses=2)
def ends_its_own_connection() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@background_job
def times_out() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = '20ms'")
        cursor.execute("SELECT pg_sleep(5)")


@background_job(max_losses=1)
def connects(dbname: str | None = None) -> None:
    # No server on port 1 (a database down), or a database the server refuses (the job's mistake).
    s = connection.settings_dict
    if dbname is None:
        psycopg.connect(host="127.0.0.1", port=1, connect_timeout=5).close()
    params = {"host": s["HOST"], "port": s["PORT"] or None, "user": s["USER"], "password": s["PASSWORD"]}
    psycopg.connect(**params, dbname=dbname, connect_timeout=5).close()


def burst_in_thread() -> tuple[Worker, threading.Thread]:
    worker = Worker(burst=True, install_signals=False, concurrency=1)
    thread = threading.Thread(target=worker.run, name="test worker")
    thread.start()
    return worker, thread


def test_a_job_whose_connection_is_ended_goes_back_to_the_queue_and_runs_again(tmp_path):
    job = sleeps_the_first_time.perform_later(marker=str(tmp_path / "ran"))
    worker, thread = burst_in_thread()
    try:

        def sleeping() -> int | None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s", [SLEEP]
                )
                row = cursor.fetchone()
            return row[0] if row else None

        pid = wait_for(sleeping, what="the job's query on the server")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive()
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.losses) == ("completed", "ran again", 1, 1), job.errors
    [entry] = job.errors
    assert entry["type"] == "DatabaseLost", entry
    assert entry["message"] == (
        "the database connection of this job was lost (loss 1 of 3 allowed); the job was queued again, no attempt used"
    )
    assert "terminating connection due to administrator command" in entry["traceback"]
    assert worker.outcomes == {"queued": 1, "completed": 1}


def test_a_job_that_ends_its_own_connection_every_time_fails_after_max_losses():
    job = ends_its_own_connection.perform_later()
    _, thread = burst_in_thread()
    thread.join(timeout=60)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.losses) == ("failed", 1, 2), job.errors
    assert job.error.startswith(
        "DatabaseLost: the database connection of this job was lost 2 times (max_losses 2), so the job failed; "
        "if the job itself ends its connection"
    ), job.error
    assert "terminating connection due to administrator command" in job.error
    assert [entry["type"] for entry in job.errors] == ["DatabaseLost", "DatabaseLost"]
    assert job.errors[-1]["message"].endswith("(loss 2 of 2 allowed); the job failed")


def test_an_operational_error_on_a_live_connection_is_the_jobs_own_failure():
    job = times_out.perform_later()
    _, thread = burst_in_thread()
    thread.join(timeout=60)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.losses) == ("failed", 1, 0)
    [entry] = job.errors
    assert entry["type"] == "django.db.utils.OperationalError"
    assert "canceling statement due to statement timeout" in entry["message"]
    assert Job.objects.count() == 1


def test_a_server_that_refuses_connections_is_a_loss_and_a_database_that_does_not_exist_a_failure():
    down = connects.perform_later()
    missing = connects.perform_later(dbname="axa_no_such_database")
    _, thread = burst_in_thread()
    thread.join(timeout=60)
    down.refresh_from_db()
    missing.refresh_from_db()
    assert (down.status, down.attempts, down.losses) == ("failed", 1, 1)
    assert down.error.startswith("DatabaseLost: the database connection of this job was lost 1 times (max_losses 1)")
    assert (missing.status, missing.attempts, missing.losses) == ("failed", 1, 0)
    assert missing.errors[-1]["type"] == "psycopg.OperationalError", missing.errors
    assert 'database "axa_no_such_database" does not exist' in missing.error
