"""A job whose database connection dies under it is lost to the database, not failed (issue 45).

At the defaults (MAX_ATTEMPTS 1) a server restart failed for good every job whose own
queries died with the connection. Now such an attempt is counted as a dead worker's is:
the row goes back to queued with its attempt given back and a loss counted, so
``max_losses`` bounds a job that ends its own connection every time. An OperationalError
on a connection that still works (a statement_timeout) is the job's own failure, as before.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test.utils import override_settings

from axa_django import Job, background_job, conf, sql
from axa_django.execution import finish, lost
from axa_django.execution.dberrors import database_lost
from axa_django.signals import job_finished
from axa_django.worker import Worker, connect
from axa_django.worker.connection import close
from tests.conftest import AXA_APPS, wait_for
from tests.races import claim, register
from tests.tasks_api import TaskResultStatus, task, task_finished
from tests.testapp import workflow_jobs as wj

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
        end_the_sleeping_backend()
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


# -- a job in a transaction (most jobs that write) --------------------------------------


@background_job
@transaction.atomic
def sleeps_in_a_transaction_the_first_time(marker: str) -> str:
    Job.objects.filter(pk__in=[]).update(priority=1)  # the transaction has begun on the server
    if not Path(marker).exists():
        Path(marker).touch()
        with connection.cursor() as cursor:
            cursor.execute(SLEEP)
    return "ran again"


def end_the_sleeping_backend() -> None:
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


def test_a_job_in_a_transaction_whose_connection_is_ended_is_lost_not_failed(tmp_path):
    # Leaving atomic(), Django's rollback fails on the dead connection and Django closes it:
    # no broken connection is left to see, only the error the job raised.
    job = sleeps_in_a_transaction_the_first_time.perform_later(marker=str(tmp_path / "ran"))
    worker, thread = burst_in_thread()
    try:
        end_the_sleeping_backend()
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive()
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.losses) == ("completed", "ran again", 1, 1), job.errors
    assert [entry["type"] for entry in job.errors] == ["DatabaseLost"]
    assert worker.outcomes == {"queued": 1, "completed": 1}


# -- which errors are the database going away -------------------------------------------


def _params(**extra: Any) -> dict[str, Any]:
    s = connection.settings_dict
    params = {"host": s["HOST"], "port": s["PORT"] or None, "user": s["USER"], "password": s["PASSWORD"]}
    return {**params, "dbname": s["NAME"], "connect_timeout": 10, "autocommit": True, **extra}


def _raised(run: Any, *, may_pass: bool = False) -> BaseException | None:
    try:
        run()
    except psycopg.Error as error:
        return error
    assert may_pass, f"{run} raised nothing"
    return None


def _port_with_no_server() -> int:
    with socket.socket() as s:  # a server restarting: its port refuses, as a stopped cluster's does
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ended(conn: psycopg.Connection[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
    conn.execute("SELECT 1")


def _in_transaction(conn: psycopg.Connection[Any], *statements: str) -> None:
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)


def _deadlock(a: psycopg.Connection[Any], b: psycopg.Connection[Any]) -> BaseException:
    """Each takes one advisory lock, then asks for the other's: the server ends one of them, with 40P01."""
    both = threading.Barrier(2, timeout=30)
    raised: list[BaseException] = []

    def lock(conn: psycopg.Connection[Any], first: int, second: int) -> None:
        try:
            with conn.transaction():
                conn.execute("SET LOCAL deadlock_timeout = '10ms'")
                conn.execute("SELECT pg_advisory_xact_lock(7351, %s)", [first])
                both.wait()
                conn.execute("SELECT pg_advisory_xact_lock(7351, %s)", [second])
        except psycopg.errors.DeadlockDetected as error:
            raised.append(error)

    threads = [threading.Thread(target=lock, args=args) for args in ((a, 1, 2), (b, 2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    [error] = raised
    return error


def test_the_database_going_away_is_told_from_the_jobs_own_errors():
    # Real errors, from the real server: a job's connection ended or refused is lost to the
    # database (restarting, the server refuses connections: libpq's errors have no
    # SQLSTATE then); a timeout, a deadlock, refused credentials or a missing database are
    # the job's own, and fail it as any error.
    with psycopg.connect(**_params()) as a, psycopg.connect(**_params()) as b:
        a.execute("SELECT pg_advisory_lock(7352)")
        own = {
            "statement timeout": _raised(
                lambda: _in_transaction(b, "SET LOCAL statement_timeout = '10ms'", "SELECT pg_sleep(5)")
            ),
            "lock timeout": _raised(
                lambda: _in_transaction(b, "SET LOCAL lock_timeout = '10ms'", "SELECT pg_advisory_lock(7352)")
            ),
            "deadlock": _deadlock(a, b),
            # None where the server trusts this host and checks no password (the embedded one).
            "wrong password": _raised(
                lambda: psycopg.connect(**_params(password="not the password")).close(), may_pass=True
            ),
            "unknown role": _raised(lambda: psycopg.connect(**_params(user="axa_no_such_role")).close()),
            "missing database": _raised(lambda: psycopg.connect(**_params(dbname="axa_no_such_database")).close()),
        }
        a.execute("SELECT pg_advisory_unlock(7352)")
        gone = {
            "backend ended": _raised(lambda: _ended(a)),
            "connection refused": _raised(
                lambda: psycopg.connect(**_params(host="127.0.0.1", port=_port_with_no_server())).close()
            ),
        }
    if own["wrong password"] is None:
        del own["wrong password"]
    else:
        assert "password authentication failed" in str(own["wrong password"])
    assert [type(error).__name__ for error in own.values()] == [
        "QueryCanceled",
        "LockNotAvailable",
        "DeadlockDetected",
        *["OperationalError"] * (len(own) - 3),
    ]
    assert {what: database_lost(error) for what, error in own.items()} == dict.fromkeys(own, False)
    assert [type(error).__name__ for error in gone.values()] == ["AdminShutdown", "OperationalError"]
    assert {what: database_lost(error) for what, error in gone.items()} == dict.fromkeys(gone, True)
    # A server starting up or shutting down refuses a connection with 57P03, which libpq
    # reports as text only (no SQLSTATE), as psycopg raises it:
    for text in ("the database system is starting up", "the database system is shutting down"):
        refused = psycopg.OperationalError(f'connection failed: connection to server at "x" failed: FATAL:  {text}')
        assert database_lost(refused), text
    # ... and behind what the job's own code raised instead:
    try:
        try:
            raise gone["connection refused"]
        except psycopg.Error:
            raise RuntimeError("could not save the order") from None
    except RuntimeError as error:
        assert database_lost(error)


# -- a job failed through max_losses is reported failed ----------------------------------


@task
def ends_its_own_connection_task() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@contextlib.contextmanager
def finished_signals() -> Iterator[tuple[dict[uuid.UUID, list[str]], list[Any]]]:
    jobs: dict[uuid.UUID, list[str]] = {}
    tasks: list[Any] = []

    def on_job(sender: Any, job_id: uuid.UUID, status: str, **kwargs: Any) -> None:
        jobs.setdefault(job_id, []).append(status)

    def on_task(sender: Any, task_result: Any, **kwargs: Any) -> None:
        tasks.append(task_result.status)

    job_finished.connect(on_job, weak=False)
    task_finished.connect(on_task, weak=False)
    try:
        yield jobs, tasks
    finally:
        job_finished.disconnect(on_job)
        task_finished.disconnect(on_task)


def test_a_job_failed_through_max_losses_is_reported_failed(caplog):
    # FINISH fails it (max_losses reached); the job thread said "queued" all the same: to
    # job_finished, in its line and in the counts of the summary, and a task's
    # task_finished was never sent.
    caplog.set_level(logging.INFO, logger="axa_django")
    job = ends_its_own_connection.using(max_losses=1).perform_later()
    result = ends_its_own_connection_task.enqueue()
    Job.objects.filter(pk=result.id).update(max_losses=1)
    with finished_signals() as (jobs, tasks):
        worker, thread = burst_in_thread()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert {key: Job.objects.get(pk=key).status for key in (job.pk, result.id)} == dict.fromkeys(
        (job.pk, result.id), "failed"
    )
    assert jobs == {job.pk: ["failed"], uuid.UUID(str(result.id)): ["failed"]}
    assert tasks == [TaskResultStatus.FAILED]
    assert worker.outcomes == {"failed": 2}
    lines = [r for r in caplog.records if "lost" in r.getMessage() and str(job.pk) in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.ERROR], [r.getMessage() for r in lines]
    assert (
        lines[0]
        .getMessage()
        .startswith(
            f"job tests.test_worker_lost_database.ends_its_own_connection {job.pk} failed: the job's database "
            "connection was lost (terminating connection due to administrator command), one loss more than "
            "max_losses allows"
        )
    ), lines[0].getMessage()


def test_a_row_claimed_ahead_that_fails_through_max_losses_keeps_when_it_started():
    # Claimed ahead of a free thread, its started_at is written with its outcome; the
    # branch that fails it (max_losses reached) left it NULL in the history.
    job = ends_its_own_connection.using(max_losses=1).perform_later()
    worker = uuid.uuid4()
    with connect("default", "test") as conn:
        register(conn, worker, [job.name])
        [claimed] = claim(conn, [job.name], worker, ahead=True)
        assert claimed.unmarked
        outcome = lost(claimed, "server closed the connection unexpectedly", "Traceback ...", worker)
        outcome.started = started = time.time() - 5  # as the ledger sets it (worker/ledger.py)
        with conn.cursor() as cursor:
            assert finish(cursor, [outcome], worker) == set()
    assert outcome.status == "failed"  # what the job thread then reports
    job.refresh_from_db()
    assert (job.status, job.losses) == ("failed", 1)
    assert job.started_at is not None and abs(job.started_at.timestamp() - started) < 0.01


def test_a_parent_failed_through_max_losses_is_reported_failed_and_its_child_cancelled():
    # A job with children is written apart (FINISH_PARENTS, with its children settled).
    parent = wj.noop.using(max_losses=1).perform_later(1)
    child = wj.noop.using(after=[parent]).perform_later(2)
    worker = uuid.uuid4()
    with connect("default", "test") as conn:
        register(conn, worker, [wj.noop.name])
        [claimed] = claim(conn, [wj.noop.name], worker)
        assert claimed.id == parent.pk
        outcome = lost(claimed, "server closed the connection unexpectedly", "Traceback ...", worker)
        with conn.cursor() as cursor:
            assert finish(cursor, [outcome], worker) == set()
    assert outcome.status == "failed"
    assert [Job.objects.get(pk=job.pk).status for job in (parent, child)] == ["failed", "cancelled"]


# -- a loss that cannot be stored ----------------------------------------------------------


def test_max_losses_is_refused_past_what_the_database_counts():
    # FINISH reads the outcome's max_losses as an int: past it, every loss raised "value
    # out of range" and was written without its loss (queued, whatever the attempts said).
    [problem] = conf.problems({"MAX_LOSSES": 2**31})
    assert str(problem) == (
        "AXA_DJANGO['MAX_LOSSES'] is 2147483648; it must be a positive whole number below 2147483647. (axa_django.E004)"
    )
    assert conf.problems({"MAX_LOSSES": 2**31 - 2}) == []
    with pytest.raises(ImproperlyConfigured, match="MAX_LOSSES"), override_settings(AXA_DJANGO={"MAX_LOSSES": 2**31}):
        conf.get("MAX_LOSSES")


REFUSE_LOSSES = """
CREATE FUNCTION axa_test_refuse_losses() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'this table counts no losses'; END $$;
CREATE TRIGGER axa_test_refuse_losses BEFORE UPDATE ON axa_queue FOR EACH ROW
    WHEN (NEW.losses > OLD.losses) EXECUTE FUNCTION axa_test_refuse_losses();
"""


def test_a_loss_the_database_refuses_spends_the_attempt_and_never_requeues_the_last():
    # A user's trigger refuses the loss: the outcome was stripped of its loss and written
    # queued, so a job on its last attempt ran, and was lost, for ever.
    job = ends_its_own_connection.using(max_attempts=1).perform_later()
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_LOSSES)
    try:
        with finished_signals() as (jobs, _):
            worker, thread = burst_in_thread()
            thread.join(timeout=30)
            if thread.is_alive():
                worker.stop()
                thread.join(timeout=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER axa_test_refuse_losses ON axa_queue; DROP FUNCTION axa_test_refuse_losses()")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.losses) == ("failed", 1, 0), job.errors
    assert job.errors[-1]["type"] == "axa_django.exceptions.UnstorableOutcome", job.errors
    assert "this table counts no losses" in job.error
    assert jobs == {job.pk: ["failed"]}


# -- after an outage, jobs start on fresh connections ----------------------------------------


@background_job
def counts_its_runs(marker: str) -> None:
    with Path(marker).open("a") as file:
        file.write("ran;")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_after_an_outage_a_job_starts_on_a_fresh_connection_and_runs_once(tmp_path):
    # A restart ends every session, the job threads' idle ones too: the next job on such a
    # thread failed at its first query, was counted lost and ran again.
    worker = Worker(install_signals=False, concurrency=1, poll_interval=0.2)
    thread = threading.Thread(target=worker.run, name="test worker")
    thread.start()
    try:
        before = counts_its_runs.perform_later(marker=str(tmp_path / "before"))
        wait_for(lambda: Job.objects.get(pk=before.pk).status == "completed", what="a job before the outage")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        after = counts_its_runs.perform_later(marker=str(tmp_path / "after"))
        wait_for(lambda: Job.objects.get(pk=after.pk).status == "completed", what="a job after the outage")
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()
    after.refresh_from_db()
    assert (after.losses, after.errors, (tmp_path / "after").read_text()) == (0, [], "ran;")


# -- an attempt lost past the lease, its row rescued and claimed here again ---------------------


@contextlib.contextmanager
def rescued_while_unwritten() -> Iterator[tuple[Worker, Any, Any, Job]]:
    """A worker's attempt lost to the database, its outcome not yet written (its thread waits for
    it), and the row rescued meanwhile, as another worker does once this one's lease is gone."""
    job = ends_its_own_connection.using(max_losses=5).perform_later()
    worker = Worker(install_signals=False, concurrency=2, names=[ends_its_own_connection.name])
    assert worker.db.open_first()
    try:
        worker.dispatcher.register()
        [first] = worker.claimer.claim([ends_its_own_connection.name], 2)
        outcome = lost(first, "server closed the connection unexpectedly", "Traceback ...", worker.id)
        worker.ledger.finished(first, outcome)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE axa_worker SET heartbeat_at = now() - interval '1 hour'")
            cursor.execute(sql.RESCUE, {"lease": 30, "stale": 60, "max_losses": 3})
        assert Job.objects.get(pk=job.pk).status == "queued"
        worker.dispatcher.register()  # its heartbeat, back: the worker is alive again
        yield worker, first, outcome, job
    finally:
        worker.db.close()


def state(job: Job) -> tuple[Any, ...]:
    job.refresh_from_db()
    return job.status, job.worker_id, job.started_at, job.attempts, job.losses


def test_a_row_claimed_again_before_its_lost_attempt_is_written_is_given_back_unstarted():
    # An outage past the lease: the row was rescued, and this worker claimed it again before
    # the lost attempt's outcome was written. FINISH's guard (running under this worker) then
    # matched the new claim: the stale outcome queued the row mid-run, and the job ran twice
    # at once; the ledger's entry of the first attempt was overwritten, then dropped.
    with rescued_while_unwritten() as (worker, first, outcome, job):
        assert worker.claimer.claim([ends_its_own_connection.name], 2) == []
        assert worker.claimer.given_back == [job.pk]
        assert state(job) == ("queued", None, None, 0, 1)  # as the rescue left it
        assert sorted(worker.ledger.owned()) == [job.pk, job.pk]  # held, its outcome pending
        conn, unwritten = worker.finisher.write(None, [outcome])
        close(conn)
        assert unwritten == {job.pk}  # the row is no longer the lost attempt's
        assert state(job) == ("queued", None, None, 0, 1)
        worker.ledger.written([outcome.id])
        worker.ledger.release(first, outcome)
        [again] = worker.claimer.claim([ends_its_own_connection.name], 2)  # now it runs, once
        assert (again.id, worker.claimer.given_back, worker.ledger.ids()) == (job.pk, [], [job.pk])


def test_a_lost_attempt_written_while_its_row_is_claimed_again_leaves_it_queued():
    # The other order: the stale outcome is written after the claim took the row again and
    # before the claimer looks at the ledger. It queued the new claim's row: run, the job
    # would have run while its row was queued for the next claim.
    with rescued_while_unwritten() as (worker, _first, outcome, job):
        execute = worker.db.execute

        def finished_meanwhile(query: str, params: dict[str, Any], **how: Any) -> Any:
            rows = execute(query, params, **how)
            if how.get("binary"):  # the claim, committed: the finisher's write comes in now
                conn, unwritten = worker.finisher.write(None, [outcome])
                close(conn)
                assert unwritten == set()  # over the new claim
                worker.ledger.written([outcome.id])
            return rows

        worker.db.execute = finished_meanwhile  # type: ignore[method-assign]
        assert worker.claimer.claim([ends_its_own_connection.name], 2) == []
        assert worker.claimer.given_back == [job.pk]
        assert state(job) == ("queued", None, None, 0, 2)  # the outcome's, a second loss; UNCLAIM found it so
        assert worker.ledger.ids() == [job.pk]


# -- a lost attempt whose cancel was asked ----------------------------------------------------


@background_job(takes_context=True)
def cancels_itself_then_ends_its_connection(context: Any) -> None:
    Job.objects.filter(pk=context.job_id).cancel()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def test_a_lost_attempt_whose_cancel_was_asked_is_reported_cancelled(caplog):
    # The requeue guard turned the retry into cancelled; FINISH reported only the rows it
    # failed, so the worker said "queued again", counted it queued and sent job_finished queued.
    caplog.set_level(logging.INFO, logger="axa_django")
    job = cancels_itself_then_ends_its_connection.perform_later()
    with finished_signals() as (jobs, _):
        worker, thread = burst_in_thread()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert Job.objects.get(pk=job.pk).status == "cancelled"
    assert (jobs, dict(worker.outcomes)) == ({job.pk: ["cancelled"]}, {"cancelled": 1})
    lines = [r.getMessage() for r in caplog.records if "lost" in r.getMessage() and str(job.pk) in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("it was cancelled, not queued again"), lines


def test_a_lost_attempt_of_a_parent_whose_cancel_was_asked_is_reported_cancelled():
    # Written apart (FINISH_PARENTS), it was read back for failed rows only.
    parent = wj.noop.perform_later(1)
    child = wj.noop.using(after=[parent]).perform_later(2)
    worker = uuid.uuid4()
    with connect("default", "test") as conn:
        register(conn, worker, [wj.noop.name])
        [claimed] = claim(conn, [wj.noop.name], worker)
        conn.execute("UPDATE axa_queue SET cancel_requested = true WHERE id = %s", [parent.pk])
        outcome = lost(claimed, "server closed the connection unexpectedly", "Traceback ...", worker)
        with conn.cursor() as cursor:
            assert finish(cursor, [outcome], worker) == set()
    assert outcome.status == "cancelled"
    assert [Job.objects.get(pk=job.pk).status for job in (parent, child)] == ["cancelled", "cancelled"]
