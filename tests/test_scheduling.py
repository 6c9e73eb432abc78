"""Queues, priorities, per-call options, unique jobs, cancel, results and signals on real PostgreSQL."""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from axa_django import DuplicateJob, Job, enqueue
from axa_django.models import Worker as WorkerRow
from axa_django.signals import job_enqueued, job_finished, job_started
from axa_django.worker import Worker
from tests.conftest import Workers, wait_for
from tests.testapp import jobs


def drain(**options: Any) -> int:
    """Run an in-process burst worker until nothing it can run is ready."""
    return Worker(burst=True, install_signals=False, **options).run()


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def in_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` in ``count`` threads released together; each has its own DB connection."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = target(index)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "an enqueuer thread hung"
    return results


# -- queues and priorities ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_priority_then_run_at_order_with_concurrency_1(log_file: str) -> None:
    jobs.record.using(priority=0).perform_later("p0-first", log_file)
    jobs.record.using(priority=-5).perform_later("p-5", log_file)
    jobs.record.using(priority=10).perform_later("p10-first", log_file)
    jobs.record.perform_later("p0-second", log_file)
    jobs.record.using(priority=10).perform_later("p10-second", log_file)

    assert drain(concurrency=1) == 0

    assert lines(log_file) == ["p10-first", "p10-second", "p0-first", "p0-second", "p-5"]


@pytest.mark.django_db(transaction=True)
def test_priorities_honoured_by_concurrent_workers(workers: Workers) -> None:
    # Everything is queued before any worker starts, so every claim chooses among all of them.
    low = jobs.slow.using(priority=1).perform_later_many([{"seconds": 0.02, "token": f"low{i}"} for i in range(30)])
    high = jobs.slow.using(priority=9).perform_later_many([{"seconds": 0.02, "token": f"high{i}"} for i in range(30)])
    for _ in range(3):
        workers.start("--concurrency", "1", "--burst")

    wait_for(lambda: Job.objects.filter(status="completed").count() == 60, what="60 jobs completed")

    order = list(Job.objects.order_by("started_at").values_list("id", flat=True))
    first_half = set(order[:30])
    high_ids = {job.id for job in high}
    low_ids = {job.id for job in low}
    # Three workers claim at the same moment at most: a low job can start ahead of a
    # high one only in a claim race, never because priority is ignored.
    assert len(first_half & low_ids) <= 2, f"{len(first_half & low_ids)} low-priority jobs ran in the first half"
    assert len(first_half & high_ids) >= 28


@pytest.mark.django_db(transaction=True)
def test_runworker_queue_claims_only_its_queues(workers: Workers, log_file: str) -> None:
    # Jobs of other queues are older and of higher priority: a worker ignoring --queue takes them first.
    others = [jobs.record.using(priority=100).perform_later(f"default{i}", log_file) for i in range(3)]
    others += [jobs.record.using(queue="reports", priority=100).perform_later(f"report{i}", log_file) for i in range(3)]
    emails = [jobs.send_email.perform_later(f"{i}", log_file) for i in range(5)]
    assert {job.queue for job in emails} == {"emails"}
    assert {job.priority for job in emails} == {5}

    workers.start("--queue", "emails", "--concurrency", "2")
    wait_for(
        lambda: Job.objects.filter(queue="emails", status="completed").count() == 5,
        what="the emails queue drained",
    )

    assert sorted(lines(log_file)) == [f"email {i}" for i in range(5)]
    assert Job.objects.filter(id__in=[job.id for job in others], status="queued").count() == 6


@pytest.mark.django_db(transaction=True)
def test_two_workers_split_by_queue(workers: Workers, log_file: str) -> None:
    workers.start("--queue", "emails", "--concurrency", "2")
    workers.start("--queue", "reports", "--queue", "default", "--concurrency", "2")
    registered = {("emails",), ("default", "reports")}
    wait_for(
        lambda: {tuple(q) for q in WorkerRow.objects.values_list("queues", flat=True)} == registered,
        what="both workers registered",
    )
    emails = jobs.send_email.perform_later_many([{"token": str(i), "log": log_file} for i in range(10)])
    reports = jobs.record.using(queue="reports").perform_later_many(
        [{"token": f"r{i}", "log": log_file} for i in range(10)]
    )
    wait_for(lambda: Job.objects.filter(status="completed").count() == 20, what="20 jobs completed")

    by_queues = {tuple(w.queues): w.id for w in WorkerRow.objects.all()}
    assert set(Job.objects.filter(id__in=[j.id for j in emails]).values_list("worker_id", flat=True)) == {
        by_queues[("emails",)]
    }
    assert set(Job.objects.filter(id__in=[j.id for j in reports]).values_list("worker_id", flat=True)) == {
        by_queues[("default", "reports")]
    }


# -- per-call options -----------------------------------------------------------------


@pytest.mark.django_db
def test_using_options_are_stored_and_do_not_change_the_job() -> None:
    job = jobs.add.using(queue="math", priority=7, max_attempts=4).perform_later(1, 2)
    job.refresh_from_db()
    assert (job.queue, job.priority, job.max_attempts) == ("math", 7, 4)
    plain = jobs.add.perform_later(1, 2)
    assert (plain.queue, plain.priority, plain.max_attempts) == ("default", 0, None)


@pytest.mark.django_db
def test_using_run_at_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        jobs.add.using(run_at=datetime.datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="run_at or delay"):
        jobs.add.using(run_at=timezone.now(), delay=datetime.timedelta(seconds=1))
    with pytest.raises(TypeError, match="delay must be a timedelta"):
        jobs.add.using(delay=5)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_past_run_at_means_now_and_future_run_at_is_kept() -> None:
    past = jobs.add.using(run_at=timezone.now() - datetime.timedelta(days=3)).perform_later(1)
    past.refresh_from_db()
    # A past run_at means the enqueue statement's time, which is also created_at.
    assert past.run_at == past.created_at

    when = timezone.now() + datetime.timedelta(hours=2)
    future = jobs.add.using(run_at=when).perform_later(1)
    future.refresh_from_db()
    assert future.run_at == when


@pytest.mark.django_db
def test_delay_is_added_to_now() -> None:
    before = timezone.now()
    job = jobs.add.using(delay=datetime.timedelta(minutes=10)).perform_later(1)
    after = timezone.now()
    job.refresh_from_db()
    assert before + datetime.timedelta(minutes=10) <= job.run_at <= after + datetime.timedelta(minutes=10)


@pytest.mark.django_db(transaction=True)
def test_delayed_job_is_not_claimed_early(log_file: str) -> None:
    later = jobs.record.using(delay=datetime.timedelta(hours=1)).perform_later("later", log_file)
    jobs.record.perform_later("now", log_file)
    assert drain(concurrency=2) == 0
    assert lines(log_file) == ["now"]
    later.refresh_from_db()
    assert later.status == "queued"


# -- unique jobs ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_unique_key_under_8_concurrent_enqueuers() -> None:
    def enqueue_one(index: int) -> Any:
        # Half take the key from the decorator's unique=, half pass the same key explicitly.
        if index % 2:
            return jobs.sync_user.perform_later(7).id
        return jobs.sync_user.using(unique_key="user:7").perform_later(user_id=7).id

    ids = in_threads(8, enqueue_one)

    assert len(set(ids)) == 1
    assert list(Job.objects.filter(name=jobs.sync_user.name).values_list("id", "unique_key")) == [(ids[0], "user:7")]


@pytest.mark.django_db(transaction=True)
def test_duplicate_returns_existing_or_raises_and_key_frees_after_finish() -> None:
    first = jobs.sync_user.perform_later(1)
    assert jobs.sync_user.perform_later(1).id == first.id
    with pytest.raises(DuplicateJob) as raised:
        jobs.sync_user.using(on_duplicate="raise").perform_later(1)
    assert raised.value.job.id == first.id
    assert "already queued" in str(raised.value)
    other = jobs.sync_user.perform_later(2)
    assert other.id != first.id

    assert drain(concurrency=2) == 0

    again = jobs.sync_user.perform_later(1)
    assert again.id != first.id
    assert Job.objects.filter(name=jobs.sync_user.name, unique_key="user:1").count() == 2


@pytest.mark.django_db
def test_bulk_enqueue_skips_duplicates_and_counts_them() -> None:
    jobs.sync_user.perform_later(1)
    result = jobs.sync_user.perform_later_many([{"user_id": 1}, {"user_id": 2}, {"user_id": 2}, {"user_id": 3}])
    assert sorted(job.args["user_id"] for job in result) == [2, 3]
    assert result.skipped == 2
    assert Job.objects.filter(name=jobs.sync_user.name).count() == 3


# -- cancel ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cancel_queued_job_is_never_claimed(log_file: str) -> None:
    job = jobs.record.perform_later("cancelled", log_file)
    keep = jobs.record.perform_later("kept", log_file)
    assert job.cancel() is True
    assert job.status == "cancelled"
    assert job.finished_at is not None
    assert job.cancel() is False

    assert drain(concurrency=2) == 0

    assert lines(log_file) == ["kept"]
    job.refresh_from_db()
    keep.refresh_from_db()
    assert (job.status, keep.status) == ("cancelled", "completed")


@pytest.mark.django_db(transaction=True)
def test_cancel_running_job_reaches_its_context_through_notify(workers: Workers) -> None:
    proc = workers.start("--concurrency", "1")
    job = jobs.with_context.perform_later(seconds=120)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", what="the job running", timeout=30)

    assert job.cancel() is True
    assert job.cancel_requested is True

    done = wait_for(
        lambda: (j := Job.objects.get(pk=job.pk)).status == "completed" and j, what="the job stopping", timeout=60
    )
    assert done.result == {"attempt": 1, "cancelled": True, "id": str(job.id)}
    assert proc.poll() is None


@pytest.mark.django_db(transaction=True)
def test_cancel_running_job_reaches_its_context_through_heartbeat(settings: Any) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "NOTIFY": False}
    worker = Worker(concurrency=1, install_signals=False)
    assert worker.notify is False
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        job = jobs.with_context.perform_later(seconds=120)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", what="the job running")
        assert Job.objects.filter(pk=job.pk).cancel() == 1
        done = wait_for(lambda: (j := Job.objects.get(pk=job.pk)).status == "completed" and j, what="the job stopping")
        assert done.result["cancelled"] is True
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("job_function", "kwargs", "status", "result"),
    [
        (jobs.async_wait, {"seconds": 120}, "cancelled", None),
        (jobs.async_wait, {"seconds": 120, "cleanup": True}, "completed", "cleaned up"),
        (jobs.stoppable, {}, "cancelled", None),
    ],
    ids=["async", "async-catches-CancelledError", "sync-raises-JobCancelled"],
)
def test_cancelled_running_job_ends_as_cancelled_and_is_not_retried(
    workers: Workers, job_function: Any, kwargs: dict[str, Any], status: str, result: Any
) -> None:
    workers.start("--concurrency", "1")
    job = job_function.perform_later(**kwargs)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", what="the job running")

    assert job.cancel() is True

    done = wait_for(
        lambda: (j := Job.objects.get(pk=job.pk)).status not in ("queued", "running") and j, what="the job ending"
    )
    assert (done.status, done.result, done.attempts) == (status, result, 1)
    if status == "cancelled":
        assert "JobCancelled" in done.error
        assert done.errors[-1]["type"] == "axa_django.exceptions.JobCancelled"
        assert done.finished_at is not None


# -- results --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_return_value_is_stored_as_json_on_the_row() -> None:
    number = jobs.add.perform_later(20, b=22)
    text = jobs.record.perform_later("hello", "")
    mapping = jobs.with_context.perform_later()
    assert drain(concurrency=2) == 0
    for job in (number, text, mapping):
        job.refresh_from_db()
        assert job.status == "completed", job.error
    assert number.result == 42
    assert text.result == "hello"
    assert mapping.result == {"attempt": 1, "cancelled": False, "id": str(mapping.id)}


@pytest.mark.django_db(transaction=True)
def test_non_json_return_value_fails_the_job_clearly() -> None:
    job = jobs.bad_result.perform_later()
    assert drain(concurrency=1) == 0
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.result is None
    assert "BadResult" in job.error
    assert "the return value of job" in job.error
    assert "not JSON" in job.error
    assert json.dumps(job.errors)  # the error history stays readable JSON
    assert job.errors[-1]["type"] == "axa_django.exceptions.BadResult"


# -- signals --------------------------------------------------------------------------


@pytest.fixture
def received() -> Iterator[dict[str, list[dict[str, Any]]]]:
    seen: dict[str, list[dict[str, Any]]] = {"enqueued": [], "started": [], "finished": []}
    lock = threading.Lock()

    def receiver_for(kind: str) -> Callable[..., None]:
        def receive(sender: Any, **kwargs: Any) -> None:
            kwargs.pop("signal")
            with lock:
                seen[kind].append({"sender": sender, **kwargs})

        return receive

    receivers = [
        (signal, receiver_for(kind))
        for signal, kind in ((job_enqueued, "enqueued"), (job_started, "started"), (job_finished, "finished"))
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    yield seen
    for signal, receiver in receivers:
        signal.disconnect(receiver)


@pytest.mark.django_db(transaction=True)
def test_signals_carry_the_right_arguments(received: dict[str, list[dict[str, Any]]]) -> None:
    ok = jobs.add.perform_later(2, 3)
    bad = jobs.count.perform_later(fail=True)
    unknown = enqueue("not.defined.here", x=1)
    bulk = jobs.add.perform_later_many([{"a": 1}, {"a": 2}])

    assert [(e["sender"], e["job"].id) for e in received["enqueued"]] == [
        (jobs.add, ok.id),
        (jobs.count, bad.id),
        (None, unknown.id),
        (jobs.add, bulk[0].id),
        (jobs.add, bulk[1].id),
    ]
    assert received["started"] == [] and received["finished"] == []

    assert drain(concurrency=2) == 0

    started = {e["job_id"]: e for e in received["started"]}
    finished = {e["job_id"]: e for e in received["finished"]}
    assert set(started) == set(finished) == {ok.id, bad.id, bulk[0].id, bulk[1].id}
    assert started[ok.id] == {"sender": jobs.add, "job_id": ok.id, "name": jobs.add.name, "attempt": 1}
    assert finished[ok.id] == {
        "sender": jobs.add,
        "job_id": ok.id,
        "name": jobs.add.name,
        "attempt": 1,
        "status": "completed",
        "error": None,
        "result": 5,
    }
    assert finished[bad.id]["sender"] is jobs.count
    assert finished[bad.id]["status"] == "failed"
    assert "told to fail" in finished[bad.id]["error"]
    assert finished[bad.id]["result"] is None
    assert finished[bulk[1].id]["result"] == 2
