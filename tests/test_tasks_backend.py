"""axa_django.backends.QueueBackend: Django's Tasks API on the axa_queue table (django.tasks on
Django >= 6.0, the django-tasks backport on 5.2)."""

import datetime
import math
import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from axa_django import Job, sql
from axa_django.backends import QueueBackend
from axa_django.checks import check_task_backends
from axa_django.worker import Worker
from tests.conftest import ROOT, wait_for
from tests.tasks_api import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.test_performance import explain
from tests.testapp import jobs, tasks

pytestmark = pytest.mark.django_db(transaction=True)


ADD = "tests.testapp.tasks.add"


def deep_list(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def burst(**options) -> Worker:
    options.setdefault("concurrency", 2)
    worker = Worker(burst=True, install_signals=False, **options)
    assert worker.run() == 0
    return worker


def insert(name: str, backend: str = "default", args: str = '{"args": [], "kwargs": {}}', **columns) -> uuid.UUID:
    """A task row written by hand, as a producer that is not this backend might."""
    job_id = uuid.uuid4()
    extra = "".join(f", {column}" for column in columns)
    values = "".join(", %s" for _ in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO axa_queue (id, name, args, backend{extra}) VALUES (%s, %s, %s::jsonb, %s{values})",
            [job_id, name, args, backend, *columns.values()],
        )
    return job_id


# -- configuration ------------------------------------------------------------------


def test_the_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, QueueBackend)
    assert (backend.supports_defer, backend.supports_priority) == (True, True)
    assert (backend.supports_get_result, backend.supports_async_task) == (True, True)


def test_building_a_backend_and_validating_a_task_touch_no_database():
    with CaptureQueriesContext(connection) as queries:
        backend = QueueBackend("fresh", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
        backend.validate_task(tasks.add)
        tasks.add.using(priority=3)
    assert (backend.max_attempts, len(queries)) == (2, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"NOPE": 1}, "unknown key 'NOPE'"),
        ({"MAX_ATTEMPT": 3}, "unknown key 'MAX_ATTEMPT' (did you mean 'MAX_ATTEMPTS'?)"),
        ({"MAX_ATTEMPTS": 0}, "'MAX_ATTEMPTS'] must be a positive int below 2147483648, not 0"),
        ({"BACKOFF": -1}, "'BACKOFF'] must be a number of seconds >= 0, not -1"),
        ("3", "must be a dict, not str"),
    ],
)
def test_bad_options_are_a_system_check_error_and_refused_at_enqueue(options, message):
    # Built without raising (Django builds every backend for its own checks), reported by
    # `manage.py check` (and so at runworker's start), and raised by enqueue, before any SQL.
    backend = QueueBackend("bad", {"OPTIONS": options})
    tasks_setting = {**settings.TASKS, "bad": {"BACKEND": "axa_django.backends.QueueBackend", "OPTIONS": options}}
    with override_settings(TASKS=tasks_setting):
        found = [m for m in check_task_backends() if m.id == "axa_django.E103"]
        assert len(found) == 1 and message in found[0].msg, found
        with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTaskBackend, match=re.escape(message)):
            tasks.add.using(backend="bad").enqueue(1)
    assert len(queries) == 0 and backend.problems


@pytest.mark.parametrize("backend", ["axa_django.backends.QueueBackend", "tests.custom_backend.CustomQueueBackend"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_ATEMPTS": 1}, "did you mean 'MAX_ATTEMPTS'?"),
        ({"MAX_ATTEMPTS": 2**31}, "must be a positive int below 2147483648, not 2147483648"),
    ],
)
def test_a_subclass_and_a_huge_max_attempts_are_checked_as_enqueue_would_refuse_them(backend, options, message):
    with override_settings(TASKS={"default": {"BACKEND": backend, "OPTIONS": options}}):
        found = [m.msg for m in check_task_backends() if m.id == "axa_django.E103"]
        assert len(found) == 1 and message in found[0], found
        with pytest.raises(InvalidTaskBackend, match=re.escape(message)):
            task_backends["default"].enqueue(tasks.add, [1], {})


def test_a_typo_in_options_stops_check_and_the_worker_start(workers):
    env = workers.env(AXA_TEST_TASK_OPTIONS='{"MAX_ATTEMPT": 3}')
    checked = subprocess.run(
        [sys.executable, "-m", "django", "check"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert checked.returncode == 1 and "axa_django.E103" in checked.stderr, checked.stderr
    assert "did you mean 'MAX_ATTEMPTS'?" in checked.stderr
    proc = workers.start("--burst", env=env)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "axa_django.E103" in output, output


def test_check_passes_here_and_reports_a_missing_app_or_another_database():
    backend = task_backends["default"]
    assert backend.check() == []
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth"]):
        assert [m.id for m in backend.check()] == ["axa_django.E101"]
    with override_settings(AXA_DJANGO={"DATABASE": "sqlite"}):
        messages = backend.check()
    assert [m.id for m in messages] == ["axa_django.E102"] and "sqlite, not PostgreSQL" in messages[0].msg


# -- enqueue ------------------------------------------------------------------------


def test_enqueue_writes_a_row_and_returns_a_ready_result():
    result = tasks.add.enqueue(1, b=2)
    assert isinstance(result.id, str)
    assert (result.status, result.args, result.kwargs, result.backend) == (
        TaskResultStatus.READY,
        [1],
        {"b": 2},
        "default",
    )
    assert result.enqueued_at is not None and result.started_at is None and result.worker_ids == []
    row = Job.objects.get(pk=result.id)
    assert (row.name, row.args, row.backend, row.queue, row.priority, row.status) == (
        "tests.testapp.tasks.add",
        {"args": [1], "kwargs": {"b": 2}},
        "default",
        "default",
        0,
        "queued",
    )
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value


def test_enqueue_then_get_result_round_trip():
    result = tasks.add.enqueue(40, b=2)
    fetched = default_task_backend.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs) == (result.id, "READY", [40], {"b": 2})
    assert fetched.task.func is tasks.add.func and fetched.enqueued_at == result.enqueued_at
    worker = burst()
    done = tasks.add.get_result(result.id)
    assert (done.status, done.return_value, done.errors) == (TaskResultStatus.SUCCESSFUL, 42, [])
    assert done.worker_ids == [str(worker.id)] and done.attempts == 1
    assert done.enqueued_at <= done.started_at <= done.finished_at and done.last_attempted_at == done.started_at
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    with pytest.raises(TaskResultMismatch):
        tasks.fail.get_result(result.id)


def test_worker_ids_after_a_retry_from_the_admin_name_the_run_of_this_round(tmp_path):
    # A retry queues the row again with attempts 0 and keeps the earlier errors: the new
    # run's worker is the row's, not the earlier round's attempt 1 (which it was before).
    marker = tmp_path / "go"
    result = tasks.wait_for_file.enqueue(str(marker), timeout=0)
    first = burst()
    failed = tasks.wait_for_file.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.worker_ids == [str(first.id)]
    marker.touch()
    assert Job.objects.get(pk=result.id).retry()
    second = burst()
    done = tasks.wait_for_file.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.worker_ids == [str(second.id)], done.worker_ids
    assert done.attempts == 1 and [e.exception_class for e in done.errors] == [TimeoutError]


@pytest.mark.parametrize(
    ("columns", "worker_ids"),
    [
        ({"errors": "5", "attempts": 1}, [""]),
        ({"errors": '[7, "x", {"attempt": [1], "worker": "w"}, {"attempt": "1", "at": "2024-02-30T10:00:00"}]'}, []),
        ({"errors": '[{"attempt": 1, "at": "2024-02-30T10:00:00", "type": 5}]', "attempts": 1}, [""]),
        ({"attempts": 30_000_000}, [""] * 1000),
    ],
)
def test_a_hand_written_row_with_odd_errors_reads_back_without_raising(columns, worker_ids):
    errors = columns.pop("errors", "[]")
    job_id = insert(ADD, errors=errors, **columns)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET errors = %s::jsonb WHERE id = %s", [errors, job_id])
    result = default_task_backend.get_result(str(job_id))
    assert result.status == TaskResultStatus.READY and result.worker_ids == worker_ids
    assert result.last_attempted_at is None


# The unknown id is a constant: every test process must collect the same test ids.
@pytest.mark.parametrize("result_id", ["", "not-a-uuid", "1234", "0b6e8d1c-6a0f-4b8e-9d2e-3f1a5c7e9b24"])
def test_a_malformed_or_unknown_id_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_rows_that_are_not_this_backends_tasks_do_not_exist_for_it():
    job = jobs.add.perform_later(1)  # a background job: no backend
    other = tasks.flaky.enqueue(succeed_on=1)  # the "retrying" alias
    for result_id in (str(job.pk), other.id):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    assert task_backends["retrying"].get_result(other.id).backend == "retrying"


def test_using_sets_priority_queue_and_run_after_on_the_row():
    later = timezone.now() + datetime.timedelta(hours=1)
    result = tasks.add.using(priority=10, queue_name="emails", run_after=later).enqueue(1)
    row = Job.objects.get(pk=result.id)
    assert (row.priority, row.queue, row.run_at) == (10, "emails", later)
    fetched = default_task_backend.get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name, fetched.task.run_after) == (10, "emails", later)
    assert burst().processed == 0  # deferred
    Job.objects.filter(pk=result.id).update(run_at=timezone.now())
    assert burst().processed == 1
    assert default_task_backend.get_result(result.id).return_value == 1


def test_higher_priority_runs_first(log_file):
    tasks.record.using(priority=-5).enqueue("low", log_file)
    tasks.record.enqueue("middle", log_file)
    tasks.record.using(priority=50).enqueue("high", log_file)
    burst(concurrency=1)
    assert [line.split()[0] for line in Path(log_file).read_text().splitlines()] == ["high", "middle", "low"]


def test_a_worker_on_other_queues_leaves_the_task_alone(log_file):
    result = tasks.send.enqueue("hi", log_file)  # queue "emails"
    assert burst(queues=["default"]).processed == 0
    assert burst(queues=["emails"]).processed == 1
    assert default_task_backend.get_result(result.id).return_value == "hi"


def test_a_worker_limited_to_job_names_runs_no_tasks():
    result = tasks.add.enqueue(1)
    assert burst(names=["CountWorker"]).processed == 0
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY


# -- validation ---------------------------------------------------------------------


def test_a_function_not_at_module_level_is_refused():
    def inner() -> None:
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(inner)


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_a_bad_priority_is_refused(priority):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks.add.using(priority=priority)


def test_a_queue_not_in_queues_is_refused():
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid for backend"):
        tasks.add.using(queue_name="nope")
    with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
        tasks.flaky.using(queue_name="emails")  # "retrying" allows only "default"


def test_a_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        tasks.add.using(run_after=datetime.datetime(2030, 1, 1))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((object(),), {}, TypeError, f"argument 0 of task '{ADD}' is a object, which is not JSON"),
        ((math.nan,), {}, ValueError, "which JSON cannot hold"),
        ((), {"b": {1: "x"}}, TypeError, "JSON object keys must be str"),
        ((), {"b": datetime.date(2030, 1, 1)}, TypeError, f"argument 'b' of task '{ADD}' is a datetime.date"),
        # Django's normalize_json would decode bytes to str: refused, as docs/tasks.md says.
        ((b"\xff",), {}, TypeError, f"argument 0 of task '{ADD}' is a bytes, which is not JSON; decode it"),
        ((b"text",), {}, TypeError, f"argument 0 of task '{ADD}' is a bytes, which is not JSON; decode it"),
        ((1,), {"b": [bytearray(b"ab")]}, TypeError, f"argument 'b' of task '{ADD}'[0] is a bytearray"),
        ((memoryview(b"ab"),), {}, TypeError, f"argument 0 of task '{ADD}' is a memoryview"),
        ((), {"b": {"k": "\x00"}}, ValueError, f"argument 'b' of task '{ADD}'['k'] contains a NUL character"),
        ((deep_list(10_000),), {}, ValueError, f"argument 0 of task '{ADD}' nests lists/dicts more than 200"),
    ],
    ids=["object", "nan", "int-key", "date", "bad-bytes", "bytes", "bytearray", "memoryview", "nul", "deep"],
)
def test_non_json_arguments_are_refused_and_nothing_is_written(args, kwargs, error, message):
    with transaction.atomic():
        with pytest.raises(error) as raised:
            tasks.add.enqueue(*args, **kwargs)
        assert message in str(raised.value)
        assert not Job.objects.exists()  # nothing was sent: the transaction is still usable


def test_tuples_are_stored_as_lists_as_django_does():
    result = tasks.add.enqueue((1, 2), b=[3])
    assert result.args == [[1, 2]]
    assert Job.objects.get(pk=result.id).args == {"args": [[1, 2]], "kwargs": {"b": [3]}}


# -- statuses -----------------------------------------------------------------------


def test_every_status(tmp_path):
    release = tmp_path / "release"
    ready = tasks.add.enqueue(1)
    running = tasks.wait_for_file.enqueue(str(release))
    assert default_task_backend.get_result(ready.id).status == TaskResultStatus.READY
    worker = Worker(concurrency=2, install_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        seen = wait_for(
            lambda: (r := default_task_backend.get_result(running.id)).status == TaskResultStatus.RUNNING and r,
            what="the task running",
        )
        assert seen.worker_ids == [str(worker.id)] and seen.started_at is not None and not seen.is_finished
        release.touch()
        wait_for(lambda: default_task_backend.get_result(running.id).is_finished, what="the task finishing")
        failed = tasks.fail.enqueue("boom")
        wait_for(lambda: default_task_backend.get_result(failed.id).is_finished, what="the failure")
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert default_task_backend.get_result(ready.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(running.id).return_value == "released"
    failure = default_task_backend.get_result(failed.id)
    assert failure.status == TaskResultStatus.FAILED and failure.is_finished
    (error,) = failure.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert "ValueError: boom" in error.traceback and "Traceback" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = failure.return_value


def test_a_cancelled_task_reads_as_failed_with_job_cancelled():
    result = tasks.add.enqueue(1)
    assert Job.objects.get(pk=result.id).cancel() is True
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in fetched.errors] == ["axa_django.exceptions.JobCancelled"]
    assert burst().processed == 0


def test_a_return_value_is_normalized_as_django_does_and_non_json_fails():
    pair = tasks.returns_tuple.enqueue()
    bad = tasks.returns_set.enqueue()
    raw = tasks.returns_bytes.enqueue()
    burst()
    assert default_task_backend.get_result(pair.id).return_value == [1, "two"]
    for result, kind in ((bad, "a set"), (raw, "a bytes")):
        failure = default_task_backend.get_result(result.id)
        assert failure.status == TaskResultStatus.FAILED
        assert failure.errors[0].exception_class_path == "axa_django.exceptions.BadResult"
        assert f"is {kind}, which is not JSON" in failure.errors[0].traceback


# -- context and retries ------------------------------------------------------------


def test_takes_context_gets_a_task_context_with_the_attempt():
    result = tasks.with_context.enqueue()
    worker = burst()
    value = default_task_backend.get_result(result.id).return_value
    assert value == {"attempt": 1, "id": result.id, "status": "RUNNING", "workers": [str(worker.id)]}


def test_retries_from_options_run_again_with_the_next_attempt():
    result = tasks.flaky.enqueue(succeed_on=3)
    assert Job.objects.get(pk=result.id).max_attempts == 3  # OPTIONS["MAX_ATTEMPTS"] of "retrying"
    burst(concurrency=1)
    done = tasks.flaky.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (TaskResultStatus.SUCCESSFUL, 3, 3)
    assert [e.exception_class_path for e in done.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 2 fails" in done.errors[1].traceback


def test_retries_end_in_failure_after_max_attempts():
    result = tasks.flaky.enqueue(succeed_on=9)
    burst(concurrency=1)
    done = tasks.flaky.get_result(result.id)
    assert (done.status, done.attempts, len(done.errors)) == (TaskResultStatus.FAILED, 3, 3)


# -- what the worker refuses ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tests.testapp.tasks.plain", "is a builtins.function, not a django.tasks Task"),
        ("tests.testapp.tasks.not_ours", "belongs to backend 'dummy', which is not a QueueBackend"),
        ("tests.testapp.no_such_module.thing", "cannot import task"),
        ("os.remove", "is a builtins.builtin_function_or_method, not a django.tasks Task"),
    ],
)
def test_a_row_that_names_no_task_of_ours_fails_and_nothing_is_called(tmp_path, name, message):
    victim = tmp_path / "keep.txt"
    victim.write_text("x")
    job_id = insert(name, args=f'{{"args": ["{victim}"], "kwargs": {{}}}}', max_attempts=3)
    assert burst().processed == 1
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.attempts) == ("failed", 1)  # refused at once, not retried
    assert message in row.error and row.errors[0]["type"] == "axa_django.exceptions.TaskRefused"
    assert victim.read_text() == "x"


def test_rows_of_a_backend_that_is_not_ours_are_not_claimed():
    job_id = insert("tests.testapp.tasks.not_ours", backend="dummy")
    assert burst().processed == 0
    assert Job.objects.get(pk=job_id).status == "queued"


def test_args_that_do_not_fit_the_task_fail_it_clearly():
    job_id = insert("tests.testapp.tasks.add", args='{"args": [], "kwargs": {"c": 1}}', max_attempts=3)
    burst()
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.attempts) == ("failed", 1)
    assert "the arguments do not fit task tests.testapp.tasks.add" in row.error


# -- signals ------------------------------------------------------------------------


def test_signals_are_sent_with_the_backend_class_as_sender():
    seen = []

    def receiver(signal, sender, task_result, **kwargs):
        seen.append((signal, sender, task_result.id, task_result.status))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver)
    try:
        ok = tasks.add.enqueue(1, b=1)
        bad = tasks.fail.enqueue("no")
        burst(concurrency=1)
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(receiver)
    assert all(sender is QueueBackend for _, sender, _, _ in seen)
    events = {(s, i, st) for s, _, i, st in seen}
    assert len(seen) == 6
    assert events == {
        (task_enqueued, ok.id, "READY"),
        (task_enqueued, bad.id, "READY"),
        (task_started, ok.id, "RUNNING"),
        (task_started, bad.id, "RUNNING"),
        (task_finished, ok.id, "SUCCESSFUL"),
        (task_finished, bad.id, "FAILED"),
    }


def test_task_finished_carries_the_outcome_and_is_not_sent_for_a_retried_attempt():
    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append(task_result)

    task_finished.connect(receiver)
    try:
        result = tasks.flaky.enqueue(succeed_on=2)
        burst(concurrency=1)
    finally:
        task_finished.disconnect(receiver)
    (done,) = finished
    assert (done.id, done.status, done.return_value, done.attempts) == (result.id, "SUCCESSFUL", 2, 2)
    assert [e.exception_class_path for e in done.errors] == ["builtins.RuntimeError"]


# -- across processes, transactions, async ------------------------------------------


def test_results_across_processes(workers, log_file):
    result = tasks.record.enqueue("far", log_file)
    proc = workers.start("--burst", "--concurrency", "1")
    assert proc.wait(timeout=120) == 0, proc.stdout.read()
    done = default_task_backend.get_result(result.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, "far")
    token, pid = Path(log_file).read_text().split()
    assert token == "far" and int(pid) == proc.pid != os.getpid()
    assert done.worker_ids == [str(Job.objects.get(pk=result.id).worker_id)]


def test_a_task_enqueued_in_a_rolled_back_transaction_never_runs():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        lost = tasks.add.enqueue(1)
        assert default_task_backend.get_result(lost.id).status == TaskResultStatus.READY  # visible inside
        raise Abort
    with transaction.atomic():
        kept = tasks.add.enqueue(2)
    assert burst().processed == 1
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(lost.id)
    assert default_task_backend.get_result(kept.id).return_value == 2


def test_aenqueue_and_aget_result_from_async_code():
    async def view() -> tuple:
        result = await tasks.add.aenqueue(2, b=3)
        fetched = await tasks.add.aget_result(result.id)
        return result, fetched

    result, fetched = async_to_sync(view)()
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs) == (result.id, "READY", [2], {"b": 3})
    burst()

    async def later() -> object:
        await result.arefresh()
        return result.return_value

    assert async_to_sync(later)() == 5


def test_an_async_task_runs_on_the_worker():
    result = tasks.async_add.enqueue(2, 3)
    burst()
    done = default_task_backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value["sum"] == 5


def test_async_tasks_run_side_by_side(log_file):
    results = [tasks.async_rendezvous.enqueue(log_file, f"t{i}", 3) for i in range(3)]
    burst(concurrency=3)
    done = [default_task_backend.get_result(result.id) for result in results]
    assert [result.status for result in done] == [TaskResultStatus.SUCCESSFUL] * 3, [r.errors for r in done]
    assert sorted(result.return_value for result in done) == ["t0", "t1", "t2"]


def test_a_background_job_and_a_task_share_one_worker(log_file):
    job = jobs.record.perform_later("job", log_file)
    result = tasks.record.enqueue("task", log_file)
    assert burst(concurrency=1).processed == 2
    job.refresh_from_db()
    assert (job.status, default_task_backend.get_result(result.id).return_value) == ("completed", "task")


def test_the_task_claim_uses_its_index_not_a_scan():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, backend) SELECT gen_random_uuid(), "
            "'tests.testapp.tasks.add', '{}', 'completed', 'default' FROM generate_series(1, 20000)"
        )
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), 'other.Job', '{}' "
            "FROM generate_series(1, 5000)"
        )
    tasks.add.enqueue(1)
    plan = explain(
        sql.compose(sql.CLAIM, ["CountWorker"], ["default"], None), {"worker": None, "limit": 4, "ahead": False}
    )
    # One walk serves the task rows and the job rows (sql/claims.py's SERVES).
    assert "axa_queue_claim_all " in plan, plan
    assert "Seq Scan on axa_queue " not in plan, plan  # the table, not axa_queue_limit


# -- run_after ------------------------------------------------------------------------


def test_past_run_after_is_stored_as_given_and_claimed_in_run_after_order(workers, log_file):
    now = timezone.now()
    hours = {"one": 1, "three": 3, "two": 2}  # enqueued out of order
    for token, ago in hours.items():
        result = tasks.record.using(run_after=now - datetime.timedelta(hours=ago)).enqueue(token, log_file)
        assert Job.objects.get(pk=result.id).run_at == now - datetime.timedelta(hours=ago)
    proc = workers.start("--burst", "--concurrency", "1")
    assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert [line.split()[0] for line in Path(log_file).read_text().splitlines()] == ["three", "two", "one"]


def test_a_background_job_keeps_its_rule_that_a_past_run_at_means_now():
    job = jobs.add.using(run_at=timezone.now() - datetime.timedelta(days=1)).perform_later(1)
    job.refresh_from_db()
    assert job.run_at == job.created_at


def test_result_task_run_after_reads_the_stored_time_back():
    past = timezone.now() - datetime.timedelta(hours=2)
    future = timezone.now() + datetime.timedelta(hours=2)
    for when in (past, future):
        result = tasks.add.using(run_after=when).enqueue(1)
        assert result.task.run_after == when
        assert default_task_backend.get_result(result.id).task.run_after == when
    plain = tasks.add.enqueue(1)
    assert plain.task.run_after is None
    assert default_task_backend.get_result(plain.id).task.run_after is None
    with transaction.atomic():  # now() is the transaction's start; the row's times are the statement's
        wait_for(lambda: timezone.now() > plain.enqueued_at, what="the clock to move")
        inside = tasks.add.enqueue(2)
    assert default_task_backend.get_result(inside.id).task.run_after is None


# -- forged rows ----------------------------------------------------------------------


def test_a_forged_row_naming_a_module_outside_installed_apps_is_refused_without_importing_it(workers, tmp_path):
    marker = tmp_path / "imported"
    code = tmp_path / "code"
    code.mkdir()
    (code / "axa_forged_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('side effect ran')\nthing = None\n"
    )
    job_id = insert("axa_forged_module.thing", max_attempts=3)
    path = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    proc = workers.start("--burst", "--concurrency", "1", env=workers.env(PYTHONPATH=path))
    assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert not marker.exists()
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.attempts) == ("failed", 1)
    assert row.errors[0]["type"] == "axa_django.exceptions.TaskRefused"
    assert "module 'axa_forged_module' is not imported and not inside an installed app" in row.error
    assert "tasks must live in a package listed in INSTALLED_APPS" in row.error


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tests.testapp.boundary_import_raises.thing", "SystemExit('boundary_import_raises: import side effect')"),
        ("", "is not a dotted path module.attribute"),
        ("noattribute", "is not a dotted path module.attribute"),
        ("..x", "is not a dotted path module.attribute"),
        ("tests.testapp..tasks.add", "is not a dotted path module.attribute"),
        ("tests.testapp.tasks.", 'does not define a "" attribute'),
        ("a" * 5000 + ".b", "is not imported and not inside an installed app"),
        (".".join(["tests", "testapp"] + ["x"] * 3000 + ["y"]), "raised RecursionError"),
    ],
    ids=["raises-on-import", "empty", "no-dot", "relative", "double-dot", "trailing-dot", "long", "deep"],
)
def test_resolving_any_row_name_never_raises(name, message):
    from axa_django.execution import Claimed
    from axa_django.execution.taskrunner import TaskRunner

    runner = TaskRunner.for_row(Claimed(uuid.uuid4(), name, {}, 1, None, backend="default"))
    assert runner.task is None and message in runner.refusal


def test_a_worker_survives_a_task_module_that_raises_system_exit_on_import(workers):
    job_id = insert("tests.testapp.boundary_import_raises.thing", max_attempts=3)
    ok = tasks.add.enqueue(2, 3)
    proc = workers.start("--burst", "--concurrency", "1")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.errors[0]["type"]) == ("failed", "axa_django.exceptions.TaskRefused")
    assert default_task_backend.get_result(ok.id).return_value == 5


def test_system_checks_list_a_bad_setting_instead_of_crashing_with_a_queue_backend():
    from django.core import checks
    from django.test import override_settings

    with override_settings(AXA_DJANGO={"mode": "immediate"}):
        messages = checks.run_checks()
    assert "axa_django.E002" in {message.id for message in messages}
