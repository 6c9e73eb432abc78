"""axa_django.testing from pytest-django: assertions on what is queued, run_jobs(), immediate mode raising."""

import datetime
import uuid

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from axa_django.models import Job
from axa_django.testing import (
    JobFailed,
    assert_enqueued,
    assert_not_enqueued,
    enqueued_jobs,
    raise_failures,
    run_jobs,
)
from tests import docs_examples
from tests.testapp import jobs
from tests.testapp import testing12_jobs as t

# The pytest-style example of docs/testing.md, run here as tests of this module.
docs_examples.run_block("shop/test_jobs.py", globals())

pytestmark = pytest.mark.django_db


def test_the_docs_pytest_example_is_collected_here():
    assert {"test_fulfilling_an_order_sends_a_receipt", "test_a_bad_address_raises"} <= set(globals())


# -- assert_enqueued, assert_not_enqueued, enqueued_jobs ---------------------------------


def test_assert_enqueued_matches_the_given_argument_values_and_returns_the_row():
    first = t.greet.perform_later("ann")
    t.greet.perform_later("bob", punctuation="?")
    assert assert_enqueued(t.greet, username="ann") == first
    assert assert_enqueued(t.greet, punctuation="?").args == {"username": "bob", "punctuation": "?"}
    assert assert_enqueued("tests.testapp.testing12_jobs.greet") == first  # by name, oldest first
    # A default left out at enqueue matches the default; by name, the job's defaults are unknown.
    assert assert_enqueued(t.greet, username="ann", punctuation="!") == first
    with pytest.raises(AssertionError):
        assert_enqueued(t.greet.name, username="ann", punctuation="!")


def test_assert_enqueued_lists_what_is_queued_when_nothing_matches():
    t.greet.perform_later("ann")
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(t.greet, username="zoe")
    message = str(failed.value)
    assert "no queued job tests.testapp.testing12_jobs.greet with arguments {'username': 'zoe'}" in message
    assert "queued jobs tests.testapp.testing12_jobs.greet (1):" in message
    assert "  {'username': 'ann'} (queue 'default', run_at " in message
    with pytest.raises(
        AssertionError, match=r"no job tests.testapp.testing12_jobs.relay is queued; queued are: .*greet"
    ):
        assert_enqueued(t.relay)
    Job.objects.all().delete()
    with pytest.raises(AssertionError, match="nothing is queued"):
        assert_enqueued(t.relay)


def test_assert_enqueued_compares_json_values_exactly():
    t.tag.perform_later([1, 2], flag=True)
    assert_enqueued(t.tag, values=[1, 2], flag=True)
    assert_enqueued(t.tag, values=[1.0, 2.0])  # JSON numbers: 1 is 1.0
    for args in ({"values": [1]}, {"values": [2, 1]}, {"flag": 1}, {"flag": None}):
        with pytest.raises(AssertionError):
            assert_enqueued(t.tag, **args)


def test_assert_enqueued_refuses_a_parameter_the_job_does_not_have():
    with pytest.raises(TypeError, match=r"job 'tests\.testapp\.testing12_jobs\.greet' has no parameter 'user'"):
        assert_enqueued(t.greet, user="ann")
    with pytest.raises(TypeError, match="expected a job"):
        assert_enqueued(42)  # type: ignore[arg-type]


def test_assert_not_enqueued_and_finished_rows_are_not_enqueued():
    assert_not_enqueued(t.greet)
    job = t.greet.perform_later("ann")
    assert_not_enqueued(t.greet, username="bob")
    with pytest.raises(AssertionError, match=r"1 queued job\(s\) tests.testapp.testing12_jobs.greet"):
        assert_not_enqueued(t.greet, username="ann")
    Job.objects.filter(pk=job.pk).update(status="completed")
    assert_not_enqueued(t.greet)


def test_enqueued_jobs_are_the_queued_rows_oldest_first_by_name_and_queue():
    a = t.report.perform_later("mon")
    b = t.greet.perform_later("ann")
    c = t.report.using(queue="default").perform_later("tue")
    later = t.greet.using(delay=datetime.timedelta(hours=1)).perform_later("bob")
    assert enqueued_jobs() == [a, b, c, later]
    assert enqueued_jobs(t.report) == [a, c]
    assert enqueued_jobs("tests.testapp.testing12_jobs.report", queue="reports") == [a]
    assert enqueued_jobs(queue="default") == [b, c, later]


# -- run_jobs -----------------------------------------------------------------------------


def test_run_jobs_runs_on_the_tests_connection_and_records_like_a_worker():
    User.objects.create(username="ann")  # uncommitted: only this connection sees it
    job = t.greet.perform_later("ann")
    [attempt] = run_jobs()
    assert (attempt.id, attempt.name, attempt.attempt, attempt.status) == (job.id, t.greet.name, 1, "completed")
    assert attempt.result == "hello ann!" and attempt.error is None and attempt.exception is None
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.worker_id, job.errors) == ("completed", "hello ann!", 1, None, [])
    assert job.finished_at is not None
    assert run_jobs() == []


def test_jobs_enqueued_by_jobs_run_in_the_same_call_in_priority_order():
    t.relay.perform_later(2)
    t.report.perform_later("high")  # priority 7, from its decorator
    attempts = run_jobs()
    assert [(a.name.rsplit(".", 1)[1], a.result) for a in attempts] == [
        ("report", "high"),
        ("relay", 2),
        ("relay", 1),
        ("relay", 0),
    ]
    assert not enqueued_jobs()


def test_a_retry_with_backoff_zero_runs_again_in_the_same_call(log_file):
    job = jobs.flaky.perform_later(log_file)
    attempts = run_jobs()
    assert [(a.attempt, a.status) for a in attempts] == [(1, "queued"), (2, "queued"), (3, "completed")]
    assert "ValueError: flaky run 1" in attempts[0].error
    assert isinstance(attempts[0].exception, ValueError)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result, len(job.errors)) == ("completed", 3, 3, 2)


def test_a_failing_job_raises_job_failed_carrying_its_exception():
    job = t.explode.perform_later("boom")
    with pytest.raises(JobFailed) as failed:
        run_jobs()
    error = failed.value
    assert isinstance(error.exception, ValueError) and str(error.exception) == "boom"
    assert error.__cause__ is error.exception
    assert [a.id for a in error.failures] == [job.id] and error.attempts == error.failures
    assert f"tests.testapp.testing12_jobs.explode {job.id} (attempt 1, failed)" in str(error)
    assert "ValueError: boom" in str(error)  # the traceback text recorded on the row
    job.refresh_from_db()
    assert job.status == "failed" and "ValueError: boom" in job.error


def test_raise_failures_false_returns_the_failed_attempts():
    t.explode.perform_later("quiet")
    t.report.perform_later("fine")
    attempts = run_jobs(raise_failures=False)
    assert sorted(a.status for a in attempts) == ["completed", "failed"]
    assert Job.objects.get(name=t.explode.name).status == "failed"


def test_an_async_jobs_exception_is_carried_too():
    t.async_explode.perform_later("key")
    with pytest.raises(JobFailed) as failed:
        run_jobs()
    assert isinstance(failed.value.exception, KeyError)


def test_a_real_backoff_leaves_the_retry_queued_and_counts_as_a_failure():
    job = t.patient.perform_later("later")
    with pytest.raises(JobFailed, match=r"attempt 1, will be retried"):
        run_jobs()
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 1
    # Counted from the real time, not from the start of the test's transaction.
    assert job.run_at > timezone.now() + datetime.timedelta(minutes=50)
    [second] = run_jobs(include_future=True, raise_failures=False)
    assert (second.attempt, second.status) == (2, "failed")


def test_future_jobs_run_only_when_asked():
    job = t.report.using(delay=datetime.timedelta(hours=1)).perform_later("tomorrow")
    assert run_jobs() == []
    assert run_jobs(now=timezone.now() + datetime.timedelta(minutes=30)) == []
    [attempt] = run_jobs(now=timezone.now() + datetime.timedelta(hours=2))
    assert attempt.id == job.id and attempt.status == "completed"
    t.report.using(delay=datetime.timedelta(days=400)).perform_later("next year")
    assert [a.result for a in run_jobs(include_future=True)] == ["next year"]
    with pytest.raises(ValueError, match="pass now or include_future, not both"):
        run_jobs(now=timezone.now(), include_future=True)
    with pytest.raises(ValueError, match="must be timezone-aware"):
        run_jobs(now=datetime.datetime(2030, 1, 1))


def test_unique_keys_hold_while_queued_and_free_once_run():
    first = jobs.sync_user.perform_later(1)
    assert jobs.sync_user.perform_later(1) == first
    run_jobs()
    second = jobs.sync_user.perform_later(1)
    assert second != first and second.status == "queued"


def test_name_and_queue_select_what_runs():
    t.report.perform_later("mon")
    t.relay.perform_later(0)
    assert [a.name for a in run_jobs(queue="default")] == [t.relay.name]
    t.relay.perform_later(0)
    assert [a.name for a in run_jobs(t.report)] == [t.report.name]
    assert [a.name for a in run_jobs("tests.testapp.testing12_jobs.relay")] == [t.relay.name]
    with pytest.raises(ValueError, match="no job 'NoSuchJob' is registered in this process"):
        run_jobs("NoSuchJob")


def test_a_job_that_keeps_enqueueing_itself_stops_after_max_rounds():
    t.forever.perform_later()
    with pytest.raises(RuntimeError, match="jobs were still due after 3 rounds"):
        run_jobs(max_rounds=3)
    assert len(enqueued_jobs(t.forever)) == 1  # every claimed row was finished


def test_a_job_whose_statement_aborts_the_tests_transaction_fails_and_the_test_goes_on():
    User.objects.create(username="kept")
    t.bad_sql.perform_later()
    [attempt] = run_jobs(raise_failures=False)
    assert attempt.status == "failed" and "division by zero" in attempt.error
    assert User.objects.filter(username="kept").exists()  # the connection is usable, the test's rows stay
    assert Job.objects.get(pk=attempt.id).status == "failed"


@pytest.mark.django_db(transaction=True)
def test_run_jobs_in_a_transactional_test_commits_like_a_worker(log_file):
    User.objects.create(username="tx")
    t.greet.perform_later("tx")
    jobs.flaky.perform_later(log_file)
    assert connection.get_autocommit()
    attempts = run_jobs()
    assert [a.status for a in attempts][-1] == "completed" and len(attempts) == 4
    assert sorted(Job.objects.values_list("status", flat=True)) == ["completed", "completed"]


# -- immediate mode -----------------------------------------------------------------------


@override_settings(AXA_DJANGO={"MODE": "immediate"})
def test_immediate_mode_by_default_still_returns_a_failed_row():
    job = t.explode.perform_later("silent")
    assert job.status == "failed" and "ValueError: silent" in job.error


@override_settings(AXA_DJANGO={"MODE": "immediate"})
def test_immediate_mode_raises_inside_raise_failures():
    with raise_failures(), pytest.raises(JobFailed) as failed:
        t.explode.perform_later("loud")
    assert isinstance(failed.value.exception, ValueError) and failed.value.__cause__ is failed.value.exception
    assert "ValueError: loud" in str(failed.value)
    with raise_failures():
        assert t.report.perform_later("fine").status == "completed"
        with raise_failures(False):
            assert t.explode.perform_later("off again").status == "failed"
    assert t.explode.perform_later("after").status == "failed"


@override_settings(AXA_DJANGO={"MODE": "immediate"})
@raise_failures()
def test_raise_failures_works_as_a_decorator_and_after_retries(log_file):
    assert jobs.flaky.perform_later(log_file).status == "completed"  # failed twice, then completed: no raise
    with pytest.raises(JobFailed):
        t.async_explode.perform_later("async")


# -- tasks rows (django.tasks, or the backport on Django 5.2) ---------------------------------


def test_run_jobs_runs_django_tasks_rows_of_the_queue_backend():
    from tests.tasks_api import TaskResultStatus
    from tests.testapp import tasks

    done = tasks.add.enqueue(2, b=3)
    retried = tasks.flaky.enqueue(succeed_on=2)  # the "retrying" alias: BACKOFF 0
    attempts = run_jobs()
    assert [(a.name, a.attempt, a.status) for a in attempts] == [
        ("tests.testapp.tasks.add", 1, "completed"),
        ("tests.testapp.tasks.flaky", 1, "queued"),
        ("tests.testapp.tasks.flaky", 2, "completed"),
    ]
    result = tasks.add.get_result(done.id)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert tasks.flaky.get_result(retried.id).return_value == 2
    failing = tasks.fail.enqueue("task boom")
    with pytest.raises(JobFailed) as failed:
        run_jobs()
    assert isinstance(failed.value.exception, ValueError) and failed.value.failures[0].id == uuid.UUID(failing.id)


def test_run_jobs_sends_the_workers_signals():
    from axa_django.signals import job_finished, job_started

    seen = []

    def started(sender, **kwargs):
        seen.append(("started", sender, kwargs["attempt"]))

    def finished(sender, **kwargs):
        seen.append(("finished", sender, kwargs["status"], kwargs["result"]))

    job_started.connect(started)
    job_finished.connect(finished)
    try:
        t.report.perform_later("signals")
        run_jobs()
    finally:
        job_started.disconnect(started)
        job_finished.disconnect(finished)
    assert seen == [("started", t.report, 1), ("finished", t.report, "completed", "signals")]
