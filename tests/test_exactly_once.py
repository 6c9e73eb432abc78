"""Exactly once for a job's database work: JobContext.complete_in_transaction, with real workers and real kills."""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.models import Count, Max, Min
from django.test import override_settings

from axa_django import Job, JobContext, JobLost
from axa_django.models import Worker
from axa_django.testing import run_jobs
from tests import docs_examples
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import exactly_once_jobs as eo
from tests.testapp import jobs
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

NOT_WRITTEN = "not written: their jobs were rescued or changed meanwhile"


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def effects(job: Job) -> list[str]:
    return list(Effect.objects.filter(job_id=job.pk).values_list("token", flat=True))


def drain(workers, *args: str) -> str:
    """Run a burst worker to the end; return what it logged."""
    proc = workers.start("--burst", "--concurrency", "4", *args)
    assert proc.wait(timeout=60) == 0
    return proc.stdout.read()


# -- the guard ------------------------------------------------------------------------------


def running(job: Job, worker: uuid.UUID | None) -> None:
    Job.objects.filter(pk=job.pk).update(status="running", worker_id=worker, attempts=1)


def test_a_context_that_no_longer_owns_the_row_is_refused_and_its_writes_roll_back():
    job = eo.pay.perform_later("lost")
    owner, mine = uuid.uuid4(), uuid.uuid4()
    running(job, owner)  # rescued and claimed by another worker meanwhile
    context = JobContext(job.pk, job.name, 1, mine)
    lost = rf"running under another worker \({owner}\): this worker lost it"
    with pytest.raises(JobLost, match=lost), transaction.atomic():
        Effect.objects.create(job_id=job.pk, token="lost")
        context.complete_in_transaction("never stored")
    assert effects(job) == []
    row = fresh(job)
    assert (row.status, row.worker_id, row.result, row.finished_at) == ("running", owner, None, None)


def test_the_refusal_rolls_back_even_if_the_job_catches_it_inside_the_block():
    job = eo.pay.perform_later("caught")
    running(job, uuid.uuid4())
    context = JobContext(job.pk, job.name, 1, uuid.uuid4())
    with transaction.atomic():
        Effect.objects.create(job_id=job.pk, token="caught")
        with contextlib.suppress(JobLost):  # a careless job: the block is marked for rollback all the same
            context.complete_in_transaction()
    assert effects(job) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"status": "queued", "worker_id": None}, "its row is queued now"),
        ({"status": "completed"}, "its row is completed now"),
        ("delete", "its row is gone"),
    ],
)
def test_a_rescued_completed_or_deleted_row_cannot_be_completed(change, says):
    job = eo.pay.perform_later("x")
    worker = uuid.uuid4()
    running(job, worker)
    if change == "delete":
        Job.objects.filter(pk=job.pk).delete()
    else:
        Job.objects.filter(pk=job.pk).update(**change)
    with pytest.raises(JobLost, match=says), transaction.atomic():
        Effect.objects.create(job_id=job.pk)
        JobContext(job.pk, job.name, 1, worker).complete_in_transaction()
    assert effects(job) == []


def test_the_owner_completes_with_its_result_and_started_at_kept():
    job = eo.pay.perform_later("mine")
    worker = uuid.uuid4()
    running(job, worker)
    Job.objects.filter(pk=job.pk).update(started_at=None)  # claimed ahead: no thread had marked it
    context = JobContext(job.pk, job.name, 1, worker)
    context._started = time.time() - 5
    with transaction.atomic():
        Effect.objects.create(job_id=job.pk, token="mine")
        context.complete_in_transaction({"paid": 12})
        assert not context.completed_itself()  # not committed yet
    assert context.completed_itself()
    row = fresh(job)
    assert (row.status, row.result, effects(job)) == ("completed", {"paid": 12}, ["mine"])
    assert 4 < (row.finished_at - row.started_at).total_seconds() < 60


def test_it_must_run_inside_an_atomic_block_and_store_json():
    job = eo.pay.perform_later("x")
    running(job, None)
    context = JobContext(job.pk, job.name, 1, None)
    with pytest.raises(transaction.TransactionManagementError, match=r"inside transaction.atomic\(using='default'\)"):
        context.complete_in_transaction()
    with pytest.raises(TypeError, match=r"the result of job .*pay' is a set"), transaction.atomic():
        context.complete_in_transaction({1})
    assert fresh(job).status == "running"


# -- in a worker ----------------------------------------------------------------------------


def test_a_worker_does_not_finish_a_job_that_completed_itself(workers):
    paid = eo.pay.perform_later_many([{"token": str(i)} for i in range(20)])
    raised = eo.pay_then_raise.perform_later("r")
    failed = eo.pay_and_fail.perform_later("f")
    via_async = eo.pay_async.perform_later("a")
    output = drain(workers)
    assert NOT_WRITTEN not in output
    for job in paid:
        row = fresh(job)
        assert (row.status, row.result, row.attempts) == ("completed", {"token": row.args["token"], "attempt": 1}, 1)
        assert row.started_at <= row.finished_at and effects(job) == [row.args["token"]]
    # Raised after its commit: it stays completed, and the worker says so.
    assert (fresh(raised).status, fresh(raised).result, effects(raised)) == ("completed", "r", ["r"])
    assert f"job {raised.name} {raised.pk} completed itself (complete_in_transaction) and then raised" in output
    # Raised inside its block: nothing of it was kept, and it failed as any job does.
    assert (fresh(failed).status, effects(failed)) == ("failed", [])
    assert "failed inside the transaction" in fresh(failed).error
    assert (fresh(via_async).status, fresh(via_async).result, effects(via_async)) == ("completed", "a", ["a"])


def test_a_worker_that_lost_the_row_cannot_complete_it_and_keeps_nothing(workers, log_file):
    job = eo.pay_when_told.perform_later(log_file, "late")
    proc = workers.start("--concurrency", "1")
    wait_for(lambda: "written" in Path(log_file).read_text(), what="the job's write")
    # Another (live) worker took the row meanwhile, as after a lost lease.
    other = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at) "
            "VALUES (%s, 'elsewhere', 1, 1, '[]', '[]', '[]', now(), now() + interval '1 hour')",
            [other],
        )
    Job.objects.filter(pk=job.pk).update(worker_id=other)
    with open(log_file, "a") as f:
        f.write("go\n")
    proc.send_signal(signal.SIGTERM)  # the job in progress ends first
    assert proc.wait(timeout=30) == 0
    output = proc.stdout.read()
    assert f"{job.pk} (attempt 1) cannot complete itself: its row is running under another worker" in output
    assert NOT_WRITTEN in output
    assert effects(job) == []
    assert (fresh(job).status, fresh(job).worker_id) == ("running", other)


def test_children_of_a_job_that_completed_itself_are_queued_in_its_transaction():
    parent = eo.pay.perform_later("parent")
    child = jobs.add.using(after=[parent]).perform_later(1, 2)
    assert fresh(child).status == "waiting"
    # Only the parent's name: nothing but its own transaction can settle the child.
    (attempt,) = run_jobs(eo.pay)
    assert (attempt.status, attempt.result) == ("completed", {"token": "parent", "attempt": 1})
    assert (fresh(parent).status, fresh(child).status, fresh(child).pending_parents) == ("completed", "queued", 0)
    assert [a.result for a in run_jobs(jobs.add)] == [3]


def test_a_failed_completion_leaves_the_children_to_the_finish():
    parent = eo.pay_and_fail.perform_later("parent")
    child = jobs.add.using(after=[parent]).perform_later(1, 2)
    run_jobs(eo.pay_and_fail, raise_failures=False)
    assert (fresh(parent).status, fresh(child).status, effects(parent)) == ("failed", "cancelled", [])


# -- run_jobs() and immediate mode ----------------------------------------------------------


def test_run_jobs_reports_the_stored_result_once(caplog):
    job = eo.pay.perform_later("t")
    raised = eo.pay_then_raise.perform_later("r")
    with caplog.at_level(logging.WARNING, "axa_django"):
        attempts = {a.id: a for a in run_jobs()}
    assert (attempts[job.pk].status, attempts[job.pk].result) == ("completed", {"token": "t", "attempt": 1})
    assert (attempts[raised.pk].status, attempts[raised.pk].result, attempts[raised.pk].exception) == (
        "completed",
        "r",
        None,
    )
    assert "and then raised RuntimeError: raised after completing itself; it stays completed" in caplog.text
    assert (fresh(job).status, effects(job), fresh(raised).status, effects(raised)) == (
        "completed",
        ["t"],
        "completed",
        ["r"],
    )


def test_run_jobs_inside_a_transaction_completes_in_it():
    with transaction.atomic():
        job = eo.pay.perform_later("t")
        failed = eo.pay_and_fail.perform_later("f")
        attempts = {a.id: a for a in run_jobs(raise_failures=False)}
        assert (attempts[job.pk].status, attempts[failed.pk].status) == ("completed", "failed")
        assert (fresh(job).result, effects(job), effects(failed)) == ({"token": "t", "attempt": 1}, ["t"], [])
    assert (fresh(job).status, fresh(failed).status) == ("completed", "failed")


def test_mistakes_fail_the_job_saying_how_to_fix_them():
    jobs_ = [
        eo.pay_outside_a_transaction.perform_later(),
        eo.pay_twice.perform_later(),
        eo.pay_with_a_bad_result.perform_later(),
        eo.pay_from_the_loop.perform_later(),
    ]
    attempts = {a.id: a for a in run_jobs(raise_failures=False)}
    errors = [attempts[job.pk].error.rstrip().splitlines()[-1] for job in jobs_]
    assert "TransactionManagementError: complete_in_transaction() completes job" in errors[0]
    assert "this attempt completed it already (complete_in_transaction() was called twice)" in errors[1]
    assert "TypeError: Unsupported type: <class 'set'>: the result of job" in errors[2]
    assert "inside the function you pass to sync_to_async" in errors[3]
    assert [fresh(job).status for job in jobs_] == ["failed"] * 4
    assert Effect.objects.count() == 0


@override_settings(AXA_DJANGO={"MODE": "immediate"})
@pytest.mark.parametrize("atomic", [False, True])
def test_immediate_mode(atomic):
    with transaction.atomic() if atomic else _nothing():
        job = eo.pay.perform_later("now")
        failed = eo.pay_and_fail.perform_later("no")
        async_job = eo.pay_async.perform_later("a")
        assert (job.status, job.result) == ("completed", {"token": "now", "attempt": 1})
        assert (failed.status, async_job.status, async_job.result) == ("failed", "completed", "a")
    assert (effects(job), effects(failed), effects(async_job)) == (["now"], [], ["a"])


class _nothing:
    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


# -- chaos ----------------------------------------------------------------------------------


@pytest.mark.halved
@pytest.mark.slow
def test_chaos_each_jobs_write_exists_exactly_once_whatever_is_killed(workers):
    """Workers SIGKILLed at random points: every job completes, its Effect written exactly once."""
    total, concurrency, fleet = 2000, "4", 3
    rng = random.Random(21)
    calls = [
        {"token": str(i), "inside": rng.choice((0.0, 0.02, 0.05)), "after": rng.choice((0.0, 0.01, 0.02))}
        for i in range(total)
    ]
    # A loss gives the attempt back and counts apart: allow plenty, so kills never fail a job.
    eo.pay.using(max_losses=1000).perform_later_many(calls)
    env = workers.env(AXA_TEST_LEASE="1")
    live = [workers.start("--concurrency", concurrency, env=env) for _ in range(fleet)]
    kills = 0
    start = time.monotonic()

    def done() -> int:
        return Job.objects.filter(name=eo.pay.name, status="completed").count()

    while kills < 15 and done() < total * 0.9:
        deadline = time.monotonic() + rng.uniform(0.3, 0.8)
        wait_for(lambda d=deadline: time.monotonic() >= d, what="the next kill")
        # A worker that has registered, so running jobs: one still starting up proves nothing.
        registered = set(Worker.objects.values_list("pid", flat=True))
        ready = [proc for proc in live if proc.pid in registered]
        if not ready:
            continue
        victim = ready[rng.randrange(len(ready))]
        live.remove(victim)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        kills += 1
        live.append(workers.start("--concurrency", concurrency, env=env))
    wait_for(lambda: done() == total, timeout=120, what="every job completed")
    elapsed = time.monotonic() - start
    for proc in live:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    rows = Job.objects.filter(name=eo.pay.name)
    assert rows.exclude(status="completed").count() == 0
    per_job = Effect.objects.values("job_id").annotate(n=Count("id"))
    assert [row for row in per_job if row["n"] != 1] == [], "a job's write committed twice"
    assert set(Effect.objects.values_list("job_id", flat=True)) == set(rows.values_list("id", flat=True))
    assert Effect.objects.count() == total
    # Effect ids come from a sequence, which a rollback does not give back: each gap is a
    # write that a kill (or a refused completion) undid before its transaction committed.
    ids = Effect.objects.aggregate(low=Min("id"), high=Max("id"))
    undone = ids["high"] - ids["low"] + 1 - total
    rescued = rows.exclude(errors=[]).count()
    assert kills >= 5 and rescued > 0 and undone > 0, "the kills never caught a job in its transaction"
    print(
        f"exactly once: {total} jobs, {kills} kills, {rescued} jobs rescued from a killed worker, {undone} writes "
        f"rolled back by a kill, {total} kept (one per job), all completed in {elapsed:.1f}s (lease 1s)"
    )


# -- the docs' example ----------------------------------------------------------------------


class LedgerEntry:
    """The page's model, stored as an Effect row (tokened account:cents)."""

    class objects:  # the manager the page's code calls
        @staticmethod
        def create(account_id: int, cents: int) -> Effect:
            return Effect.objects.create(job_id=uuid.uuid4(), token=f"{account_id}:{cents}")


def test_the_jobs_page_example():
    block = "from django.db import transaction"
    others = frozenset(b.key for b in docs_examples.page_blocks("docs/jobs.md") if b.key != block)
    with docs_examples.Page("docs/jobs.md", skip=others) as page:
        credit = page.run(block, LedgerEntry=LedgerEntry)["credit"]
        job = credit.perform_later(7, 250)
        (attempt,) = run_jobs()
        (entry,) = Effect.objects.all()
        assert (attempt.status, attempt.result, entry.token) == ("completed", {"entry": entry.pk}, "7:250")
        assert (fresh(job).status, fresh(job).result) == ("completed", {"entry": entry.pk})
