"""timeout= where a job runs in the caller's thread: immediate mode and testing.run_jobs() stop it as a worker does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings

from axa_django import Job, JobTimeout
from axa_django.testing import JobFailed, raise_failures, run_jobs
from tests.conftest import AXA_APPS
from tests.testapp import flow_jobs, testing12_jobs
from tests.testapp import timeout_inline_jobs as t

IMMEDIATE = override_settings(AXA_DJANGO={"MODE": "immediate"})
# Each job overruns its timeout (0.1 to 0.3 s) by far: stopped, it returns well before this.
OVERRUN = 3.0
STOPPED_WITHIN = 2.0

pytestmark = [
    pytest.mark.django_db,
    # JobTimeout is raised in the job's thread wherever it is (PyThreadState_SetAsyncExc),
    # and now and then that is a finalizer the garbage collector runs there (Django's
    # signals use weakref.finalize): Python then prints "Exception ignored in: <finalize
    # object ...>" instead of raising, and the attempt fails with JobTimeout as it ends
    # (Watch.expire), which each test checks. Seen once in .ci/run on 2026-12-04.
    pytest.mark.filterwarnings(
        r"ignore:Exception ignored in. <finalize object:pytest.PytestUnraisableExceptionWarning"
    ),
]
# Transactional tests flush only these apps' tables after each.
COMMITTING = [*AXA_APPS, "django.contrib.auth", "django.contrib.contenttypes"]


def timed_out(job: Job, attempt: int = 1) -> bool:
    """The row ended failed with JobTimeout, as a worker records it."""
    job.refresh_from_db()
    entry = job.errors[-1]
    return (
        job.status == "failed"
        and job.attempts == attempt
        and entry["type"] == "axa_django.exceptions.JobTimeout"
        and "ran past its timeout" in entry["message"]
        and "JobTimeout" in (job.error or "")
    )


def transaction_usable(username: str) -> None:
    """The caller's transaction goes on: it writes and reads, in the state it was in before the job."""
    User.objects.create(username=username)
    assert User.objects.filter(username=username).count() == 1


def in_test_transaction() -> bool:
    """Inside pytest-django's atomic block, with no savepoint of a job left over."""
    return connection.in_atomic_block and len(connection.atomic_blocks) == 1 and not connection.savepoint_ids


# -- immediate mode -----------------------------------------------------------------


@IMMEDIATE
def test_immediate_a_sync_job_past_its_timeout_fails_with_job_timeout(tmp_path: Path) -> None:
    log = tmp_path / "log"
    started = time.monotonic()
    job = t.naps.perform_later(OVERRUN, str(log))
    assert time.monotonic() - started < STOPPED_WITHIN
    assert job.status == "failed" and timed_out(job)
    assert "ran past its timeout of 0.3s" in job.errors[0]["message"] and job.result is None
    assert log.read_text() == "start\n"
    assert in_test_transaction()
    transaction_usable("after-sync")


@IMMEDIATE
def test_immediate_an_async_job_past_its_timeout_is_cancelled_and_fails_with_job_timeout(tmp_path: Path) -> None:
    log = tmp_path / "log"
    started = time.monotonic()
    job = t.async_naps.perform_later(OVERRUN, str(log))
    assert time.monotonic() - started < STOPPED_WITHIN
    assert job.status == "failed" and timed_out(job)
    assert log.read_text() == "cancelled\n"
    assert in_test_transaction()
    transaction_usable("after-async")


@IMMEDIATE
def test_immediate_jobs_within_their_timeout_complete() -> None:
    # Well within (a loaded machine may pause a job for a while).
    assert (t.naps.using(timeout=5).perform_later(0.05).result, t.naps.perform_later(0).status) == ("woke", "completed")
    job = t.async_naps.using(timeout=5).perform_later(0.05)
    assert (job.status, job.result, job.errors) == ("completed", "woke", [])
    [timeout, deadline] = t.deadline_of.perform_later().result
    job = Job.objects.get(name=t.deadline_of.name)
    # The context's deadline: the attempt's start plus its timeout, as a worker gives it.
    assert timeout == 0.3 and 0 <= deadline - (job.started_at.timestamp() + 0.3) < 1


@IMMEDIATE
def test_immediate_the_rows_timeout_from_using_is_kept() -> None:
    job = flow_jobs.untimed.using(timeout=0.2).perform_later(OVERRUN)
    assert job.timeout == 0.2 and timed_out(job)
    assert "ran past its timeout of 0.2s" in job.errors[0]["message"]


@IMMEDIATE
def test_immediate_raise_failures_raises_job_failed_naming_job_timeout() -> None:
    with raise_failures(), pytest.raises(JobFailed) as failed:
        t.naps.perform_later(OVERRUN)
    assert "axa_django.exceptions.JobTimeout: attempt 1 of job" in str(failed.value)
    assert isinstance(failed.value.exception, JobTimeout)
    assert "ran past its timeout of 0.3s" in str(failed.value.exception)
    assert failed.value.__cause__ is failed.value.exception
    transaction_usable("after-raise")


@IMMEDIATE
def test_immediate_a_timed_out_attempt_is_retried_per_max_attempts(tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = t.overruns_once.perform_later(OVERRUN, str(log))
    assert (job.status, job.attempts, job.result) == ("completed", 2, "second")
    assert [entry["type"] for entry in job.errors] == ["axa_django.exceptions.JobTimeout"]
    assert log.read_text() == "start\nstart\n"
    # Both attempts past their timeout: failed after the second.
    both = t.naps.using(max_attempts=2).perform_later(OVERRUN)
    assert timed_out(both, attempt=2) and len(both.errors) == 2


@IMMEDIATE
def test_immediate_a_job_that_catches_job_timeout_and_returns_still_fails(tmp_path: Path) -> None:
    log = tmp_path / "log"
    job = t.catches.perform_later(OVERRUN, str(log))
    assert timed_out(job) and job.result is None
    assert log.read_text() == "caught\n"


@IMMEDIATE
def test_immediate_a_job_blocked_in_c_fails_with_job_timeout_once_it_returns() -> None:
    # No grace and no giving up here (the caller waits for its job): it fails when it returns.
    started = time.monotonic()
    job = t.blocked_in_c.perform_later(0.6)
    assert time.monotonic() - started >= 0.6
    assert timed_out(job) and job.result is None


@IMMEDIATE
def test_immediate_a_statement_running_at_the_deadline_is_cancelled() -> None:
    started = time.monotonic()
    job = t.sleeps_in_the_database.perform_later(OVERRUN)
    assert time.monotonic() - started < STOPPED_WITHIN
    assert timed_out(job)
    assert in_test_transaction()
    transaction_usable("after-pg-sleep")


@IMMEDIATE
@pytest.mark.parametrize("round_", range(6))
def test_immediate_a_job_stopped_inside_the_database_code_leaves_the_callers_transaction_usable(round_: int) -> None:
    # JobTimeout lands wherever the job is: in its atomic() blocks, Django's ORM, psycopg.
    job = t.writes.perform_later(f"w{round_}-", OVERRUN)
    assert timed_out(job)
    assert in_test_transaction() and not connection.needs_rollback
    transaction_usable(f"after-writes-{round_}")


@IMMEDIATE
@pytest.mark.parametrize("round_", range(3))
def test_immediate_an_async_job_stopped_while_it_queries_leaves_the_callers_transaction_usable(
    round_: int, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    job = t.async_queries.perform_later(OVERRUN, str(log))
    assert timed_out(job) and log.read_text() == "cancelled\n"
    assert in_test_transaction()
    transaction_usable(f"after-async-queries-{round_}")


@IMMEDIATE
def test_immediate_no_job_timeout_escapes_into_the_callers_code() -> None:
    # Jobs ending right at their deadline: a JobTimeout raised as one returns must not land after it.
    for _ in range(15):
        job = flow_jobs.untimed.using(timeout=0.02).perform_later(0.02)
        assert job.status in ("completed", "failed")
        flow_jobs.nap(0.03)  # a late JobTimeout would land here, in the caller's own code


@IMMEDIATE
def test_immediate_a_jobs_failed_statement_is_rolled_back_to_where_the_job_began() -> None:
    # Each attempt runs in a savepoint, as in run_jobs(): the caller's transaction goes on.
    job = testing12_jobs.bad_sql.perform_later()
    assert job.status == "failed" and job.errors[-1]["type"] == "django.db.utils.DataError"
    assert in_test_transaction()
    transaction_usable("after-bad-sql")


@pytest.mark.django_db(transaction=True, available_apps=COMMITTING)
@IMMEDIATE
@pytest.mark.parametrize("round_", range(4))
def test_immediate_in_autocommit_a_job_stopped_inside_atomic_leaves_the_connection_autocommitting(
    round_: int,
) -> None:
    job = t.writes.perform_later(f"a{round_}-", OVERRUN)
    assert timed_out(job)
    assert connection.get_autocommit() and not connection.in_atomic_block
    transaction_usable(f"after-autocommit-{round_}")


# -- run_jobs() ---------------------------------------------------------------------


def test_run_jobs_stops_jobs_past_their_timeout_and_raises_naming_job_timeout(tmp_path: Path) -> None:
    sync_log, async_log = tmp_path / "sync", tmp_path / "async"
    slow = t.naps.perform_later(OVERRUN, str(sync_log))
    slow_async = t.async_naps.perform_later(OVERRUN, str(async_log))
    quick = t.naps.using(timeout=5).perform_later(0.01)
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        run_jobs()
    assert time.monotonic() - started < 2 * STOPPED_WITHIN
    assert {a.id for a in failed.value.failures} == {slow.id, slow_async.id}
    assert all(isinstance(a.exception, JobTimeout) for a in failed.value.failures)
    assert isinstance(failed.value.exception, JobTimeout) and "axa_django.exceptions.JobTimeout" in str(failed.value)
    assert timed_out(slow) and timed_out(slow_async)
    assert sync_log.read_text() == "start\n" and async_log.read_text() == "cancelled\n"
    quick.refresh_from_db()
    assert (quick.status, quick.result) == ("completed", "woke")
    assert in_test_transaction()
    transaction_usable("after-run-jobs")


def test_run_jobs_retries_a_timed_out_attempt_per_max_attempts(tmp_path: Path) -> None:
    job = t.overruns_once.perform_later(OVERRUN, str(tmp_path / "log"))
    attempts = run_jobs()
    assert [(a.status, a.attempt) for a in attempts] == [("queued", 1), ("completed", 2)]
    assert isinstance(attempts[0].exception, JobTimeout)
    job.refresh_from_db()
    assert (job.status, job.result, [e["type"] for e in job.errors]) == (
        "completed",
        "second",
        ["axa_django.exceptions.JobTimeout"],
    )


def test_run_jobs_keeps_the_rows_timeout_and_returns_the_attempts_when_asked() -> None:
    job = flow_jobs.untimed.using(timeout=0.2).perform_later(OVERRUN)
    [attempt] = run_jobs(raise_failures=False)
    assert attempt.status == "failed" and isinstance(attempt.exception, JobTimeout)
    assert timed_out(job)


@pytest.mark.parametrize("round_", range(3))
def test_run_jobs_a_job_stopped_inside_the_database_code_leaves_the_tests_transaction_usable(round_: int) -> None:
    job = t.writes.perform_later(f"r{round_}-", OVERRUN)
    [attempt] = run_jobs(raise_failures=False)
    assert attempt.status == "failed" and timed_out(job)
    assert in_test_transaction()
    transaction_usable(f"after-run-jobs-writes-{round_}")
