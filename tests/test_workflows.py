"""Workflows: dependencies (after=), fan-out/fan-in, workflow() and batch(), with real workers."""

import signal
import uuid
from pathlib import Path

import pytest
from django.db import connection, transaction

from axa_django import Job, batch, dependencies, sql, workflow
from axa_django.execution import Outcome, finish
from axa_django.models import Dependency, Workflow
from axa_django.worker import connect
from tests.conftest import AXA_APPS, CountingCursor, wait_for
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def lines(path) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


def status(job) -> str:
    return Job.objects.get(pk=job.pk).status


def statuses(jobs) -> list[str]:
    found = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("id", "status"))
    return [found[j.pk] for j in jobs]


def drained(*jobs):
    return lambda: all(s in ("completed", "failed", "cancelled") for s in statuses(jobs))


def test_a_child_waits_for_its_parent_and_runs_after_it(workers, log_file):
    a = wj.step.perform_later("a", log_file)
    b = wj.step.using(after=[a]).perform_later("b", log_file)
    assert status(b) == "waiting" and Job.objects.get(pk=b.pk).pending_parents == 1
    workers.start("--concurrency", "2")
    wait_for(drained(a, b), what="both done")
    assert statuses([a, b]) == ["completed", "completed"]
    assert lines(log_file) == ["start a", "end a", "start b", "end b"]


def order_ok(log, before: str, after: str) -> bool:
    found = lines(log)
    return found.index(f"end {before}") < found.index(f"start {after}")


def test_a_diamond_runs_in_dependency_order_each_job_once(workers, log_file):
    with workflow("diamond") as wf:
        a = wf.add(wj.step, "a", log_file)
        b = wf.add(wj.step, "b", log_file, seconds=0.2, after=[a])
        c = wf.add(wj.step, "c", log_file, after=[a])
        d = wf.add(wj.step, "d", log_file, after=[b, c])
    assert [j.status for j in (a, b, c, d)] == ["queued", "waiting", "waiting", "waiting"]
    assert Job.objects.get(pk=d.pk).pending_parents == 2
    workers.start("--concurrency", "4")
    wait_for(drained(a, b, c, d), what="diamond done")
    assert statuses([a, b, c, d]) == ["completed"] * 4
    assert sorted(lines(log_file)) == sorted(f"{w} {t}" for t in "abcd" for w in ("start", "end"))
    assert order_ok(log_file, "a", "b") and order_ok(log_file, "a", "c")
    assert order_ok(log_file, "b", "d") and order_ok(log_file, "c", "d")
    assert wf.workflow.counts()["completed"] == 4


def test_a_three_level_tree_runs_parents_before_children(workers, log_file):
    root = wj.step.perform_later("r", log_file)
    mids = wj.step.using(after=[root]).perform_later_many([{"token": f"m{i}", "log": log_file} for i in range(3)])
    leaves = [
        wj.step.using(after=[mid]).perform_later_many([{"token": f"l{i}{k}", "log": log_file} for k in range(2)])
        for i, mid in enumerate(mids)
    ]
    everything = [root, *mids, *[leaf for group in leaves for leaf in group]]
    assert {j.status for j in everything[1:]} == {"waiting"}
    workers.start("--concurrency", "3")
    wait_for(drained(*everything), what="tree done")
    assert set(statuses(everything)) == {"completed"}
    found = lines(log_file)
    assert len(found) == 2 * len(everything)  # each job ran once
    for i in range(3):
        assert order_ok(log_file, "r", f"m{i}")
        for k in range(2):
            assert order_ok(log_file, f"m{i}", f"l{i}{k}")


def test_a_dependency_on_a_completed_job_is_satisfied_at_once():
    parent = wj.noop.perform_later(1)
    Job.objects.filter(pk=parent.pk).update(status="completed")
    child = wj.noop.using(after=[parent]).perform_later(2)
    assert child.status == "queued" and child.pending_parents == 0
    assert Job.objects.get(pk=parent.pk).has_children


def test_a_dependency_on_a_missing_job_is_refused_and_nothing_is_written():
    parent = wj.noop.perform_later(1)
    ghost = uuid.uuid4()
    before = Job.objects.count()
    with pytest.raises(ValueError, match=f"do not exist: {ghost}"):
        wj.noop.using(after=[parent, ghost]).perform_later_many([{"i": i} for i in range(3)])
    with pytest.raises(ValueError, match="do not exist"), workflow("broken") as wf:
        a = wf.add(wj.noop, 1)
        wf.add(wj.noop, 2, after=[a, ghost])
    assert Job.objects.count() == before
    assert not Job.objects.get(pk=parent.pk).has_children
    assert not Dependency.objects.exists()


def test_after_refuses_what_is_not_a_job_before_any_sql():
    with pytest.raises(TypeError, match=r"after=\[0\]: expected a job"):
        wj.noop.using(after=[42])
    with pytest.raises(ValueError, match="is not a job id"):
        wj.noop.using(after=["'; DROP TABLE axa_queue; --"])
    with pytest.raises(ValueError, match="on_parent_failure must be"):
        wj.noop.using(after=[], on_parent_failure="maybe")
    with pytest.raises(ValueError, match="cannot have a unique key"):
        wj.noop.using(after=[uuid.uuid4()], unique_key="k")
    with pytest.raises(TypeError, match="takes a list"):
        wj.noop.using(after=3.5)
    with pytest.raises(ValueError, match="cannot have a unique key"), workflow("keyed") as wf:
        wf.add(wj.keyed, 1)
    with pytest.raises(ZeroDivisionError), workflow("raising key") as wf:
        wf.add(wj.keyed, 0)
    assert not Job.objects.exists()


def test_a_cycle_cannot_be_formed_a_job_waiting_for_a_later_one_is_refused():
    # A job can only name jobs that already exist (or were added before it in the same
    # workflow): its own id, or a later job's, is unknown when it is written.
    with pytest.raises(ValueError, match="do not exist"), workflow("cycle") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2, after=[a])
        wf.jobs[0] = a  # the handles are plain rows-to-be; re-pointing a at b is the only way round
        wf._items[0] = (wf._items[0][0], wf._items[0][1], wf._items[0][2].__class__(after=(b.pk,)), a.pk)
    assert not Job.objects.exists()


def test_a_failed_parent_cancels_its_descendants_and_run_children_run_anyway(workers, log_file):
    with workflow("failing") as wf:
        a = wf.add(wj.step, "a", log_file, fail=True)
        b = wf.add(wj.step, "b", log_file, after=[a])
        c = wf.add(wj.step, "c", log_file, after=[b])
        d = wf.add(wj.step, "d", log_file, after=[a], on_parent_failure="run")
        e = wf.add(wj.step, "e", log_file, after=[b], on_parent_failure="run")
    Job.objects.filter(pk=a.pk).update(max_attempts=1)
    workers.start("--concurrency", "2")
    wait_for(drained(a, b, c, d, e), what="settled")
    assert statuses([a, b, c, d, e]) == ["failed", "cancelled", "cancelled", "completed", "completed"]
    assert Job.objects.get(pk=b.pk).error == f"ParentFailed: parent job {a.pk} ended failed, so this job was cancelled"
    assert (
        Job.objects.get(pk=c.pk).error == f"ParentFailed: parent job {b.pk} ended cancelled, so this job was cancelled"
    )
    assert "start b" not in lines(log_file) and "start c" not in lines(log_file)


def test_retrying_a_failed_parent_revives_its_cancelled_descendants(workers, log_file):
    with workflow("retry") as wf:
        a = wf.add(wj.fail_once, "a", log_file)
        b = wf.add(wj.step, "b", log_file, after=[a])
        c = wf.add(wj.step, "c", log_file, after=[b])
    workers.start("--concurrency", "2")
    wait_for(drained(a, b, c), what="first failure")
    assert statuses([a, b, c]) == ["failed", "cancelled", "cancelled"]
    with transaction.atomic():  # read before a worker can see a queued again, run it and release b
        assert Job.objects.filter(pk=a.pk).retry() == 1
        assert statuses([b, c]) == ["waiting", "waiting"]
    wait_for(lambda: statuses([a, b, c]) == ["completed"] * 3, what="revived chain")
    assert lines(log_file) == ["start a", "start a", "end a", "start b", "end b", "start c", "end c"]


def test_cancelling_a_workflow_cancels_everything_not_finished():
    with workflow("cancel me") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2, after=[a])
        wf.add(wj.noop, 3, after=[b])
    other = wj.noop.perform_later(4)
    assert wf.cancel() == 3
    assert set(wf.workflow.jobs().values_list("status", flat=True)) == {"cancelled"}
    assert status(other) == "queued"


def test_cancelling_a_waiting_job_cancels_its_descendants():
    a = wj.noop.perform_later(1)
    b = wj.noop.using(after=[a]).perform_later(2)
    c = wj.noop.using(after=[b]).perform_later(3)
    d = wj.noop.using(after=[b], on_parent_failure="run").perform_later(4)
    assert b.cancel()
    assert statuses([a, b, c, d]) == ["queued", "cancelled", "cancelled", "queued"]


@pytest.mark.halved
def test_killed_parents_are_rescued_their_children_wait_and_run_once_or_are_cancelled(workers, log_file):
    # One SIGKILL, two parents: one at the defaults (rescued, run again, then its
    # children run once), one allowed no loss (failed by the rescue, its child cancelled).
    parent = wj.step.perform_later("p", log_file, seconds=60)
    children = wj.step.using(after=[parent]).perform_later_many([{"token": f"k{i}", "log": log_file} for i in range(3)])
    spent = wj.step.using(max_losses=1).perform_later("s", log_file, seconds=60)
    orphan = wj.step.using(after=[spent]).perform_later("o", log_file)
    first = workers.start("--concurrency", "2")
    wait_for(lambda: {"start p", "start s"} <= set(lines(log_file)), what="parents running")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    Job.objects.filter(pk=parent.pk).update(args={"token": "p", "log": log_file})  # quick second run
    assert statuses([*children, orphan]) == ["waiting"] * 4
    workers.start("--concurrency", "2")
    wait_for(drained(parent, *children, orphan), timeout=60, what="rescued parents and children")
    assert statuses([parent, *children]) == ["completed"] * 4
    assert statuses([spent, orphan]) == ["failed", "cancelled"]
    assert Job.objects.get(pk=orphan.pk).error.startswith(f"ParentFailed: parent job {spent.pk} ended failed")
    found = lines(log_file)
    assert found.count("start p") == 2 and all(found.count(f"start k{i}") == 1 for i in range(3))
    assert found.index("end p") < min(found.index(f"start k{i}") for i in range(3))
    assert "start o" not in found


def test_a_child_reads_its_parents_results(workers, log_file):
    a = wj.noop.perform_later(1)
    b = wj.noop.perform_later(2)
    child = wj.gather.using(after=[a, b]).perform_later(log_file)
    workers.start("--concurrency", "2")
    wait_for(drained(a, b, child), what="gathered")
    assert Job.objects.get(pk=child.pk).result == [1, 2]
    assert lines(log_file) == ["gather [1, 2]"]


def callback_rows(b) -> dict[str, Job]:
    found = {}
    for job in Job.objects.filter(workflow_id=b.id, name="axa_django.batch_callback"):
        found[job.args["kind"]] = job
    return found


def test_a_batch_runs_on_complete_once_with_counts_and_on_failure_once_if_any_failed(workers, log_file):
    with batch("orders", on_complete=wj.batch_report.using(queue="reports"), on_failure=wj.batch_alert) as b:
        for i in range(4):
            b.add(wj.step, f"o{i}", log_file, fail=i == 2)
    Job.objects.filter(workflow_id=b.id, name=wj.step.name).update(max_attempts=1)
    callbacks = callback_rows(b)
    assert callbacks["complete"].queue == "reports" and callbacks["complete"].status == "waiting"
    workers.start("--concurrency", "2", "--queue", "default", "--queue", "reports")
    wait_for(drained(*callbacks.values()), what="callbacks")
    done = {kind: Job.objects.get(pk=job.pk) for kind, job in callbacks.items()}
    counts = done["complete"].result["counts"]
    assert done["complete"].status == "completed" and done["complete"].result["report"] == str(b.id)
    assert (counts["completed"], counts["failed"], counts["total"]) == (3, 1, 4)
    assert done["failure"].status == "completed" and done["failure"].result["alert"] == str(b.id)
    assert b.workflow.counts()["completed"] == 5 and b.workflow.kind == "batch"


def test_a_batch_without_failures_does_not_call_on_failure(workers):
    with batch(on_complete=wj.batch_report, on_failure=wj.batch_alert) as b:
        b.add(wj.noop, 1)
        b.add(wj.noop, 2)
    callbacks = callback_rows(b)
    workers.start("--concurrency", "2")
    wait_for(drained(*callbacks.values()), what="callbacks")
    assert Job.objects.get(pk=callbacks["failure"].pk).result == {
        "called": False,
        "reason": "no job of the batch failed",
    }
    assert Job.objects.get(pk=callbacks["complete"].pk).result["counts"]["completed"] == 2


def test_a_batch_of_no_jobs_queues_on_complete_at_once():
    with batch(on_complete=wj.batch_report, on_failure=wj.batch_alert) as b:
        pass
    callbacks = callback_rows(b)
    assert list(callbacks) == ["complete"] and callbacks["complete"].status == "queued"


def test_batch_and_workflow_refuse_bad_input_and_write_nothing():
    with pytest.raises(TypeError, match="must be a @background_job"):
        batch(on_complete=print)
    with pytest.raises(TypeError, match=r"cannot be called as .*batch_id=\.\.\., counts=\.\.\."):
        batch(on_complete=wj.noop)
    with pytest.raises(TypeError, match="takes a context"):
        batch(on_failure=wj.gather)
    with pytest.raises(TypeError, match="takes a @background_job"), workflow("x") as wf:
        wf.add(print, 1)
    with pytest.raises(TypeError, match=r"job '.*noop'"), workflow("x") as wf:
        wf.add(wj.noop, 1, 2, 3)
    with pytest.raises(ValueError, match="unprintable"):
        workflow("bad\x00name")
    with pytest.raises(RuntimeError, match="inside 'with"):
        wf.add(wj.noop, 1)
    with pytest.raises(ZeroDivisionError), batch(on_complete=wj.batch_report) as b:
        b.add(wj.noop, 1)
        1 / 0  # noqa: B018
    assert not Job.objects.exists()


def test_workflows_and_batches_run_in_immediate_mode(settings):
    settings.AXA_DJANGO = {"MODE": "immediate"}
    with workflow("inline") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2, after=[a])
        c = wf.add(wj.gather, "/dev/null", after=[a, b])
    assert statuses([a, b, c]) == ["completed"] * 3
    assert Job.objects.get(pk=c.pk).result == [1, 2]
    with batch(on_complete=wj.batch_report) as bt:
        bt.add(wj.noop, 3)
    assert Job.objects.get(workflow_id=bt.id, name="axa_django.batch_callback").result["counts"]["completed"] == 1


def test_children_of_a_parent_finished_by_the_seeds_finish_are_released_by_housekeeping(workers, log_file):
    # A Rust worker on axa ends a parent with the seed's own FINISH, which knows nothing
    # of children: a worker's housekeeping settles them.
    parent = wj.noop.perform_later(1)
    child = wj.step.using(after=[parent]).perform_later("c", log_file)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET status = 'running', started_at = now() WHERE id = %s", [parent.pk])
        cursor.execute(
            "UPDATE axa_queue SET status = %s, error = %s, updated_at = now() WHERE id = %s",
            ["completed", None, parent.pk],
        )
    workers.start("--concurrency", "1")
    wait_for(lambda: status(child) == "completed", what="child released by housekeeping")
    assert lines(log_file) == ["start c", "end c"]


def test_pruning_old_jobs_deletes_their_edges_too():
    from axa_django import pruning

    with workflow("old") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2, after=[a])
    live_parent = wj.noop.perform_later(3)
    live_child = wj.noop.using(after=[live_parent]).perform_later(4)
    Job.objects.filter(pk__in=[a.pk, b.pk]).update(
        status="completed", created_at="2000-01-01T00:00Z", updated_at="2000-01-01T00:00Z"
    )
    assert pruning.prune(pruning.parse_duration("7d")) == 2
    assert list(Dependency.objects.values_list("parent_id", "child_id")) == [(live_parent.pk, live_child.pk)]
    assert not Workflow.objects.filter(pk=wf.id).exists()


def test_hostile_names_and_a_raising_callback_leave_the_worker_running(workers, log_file):
    name = "%s {names} '; DROP TABLE axa_queue; -- %(ids)s"
    with batch(name, on_complete=wj.batch_report, on_failure=wj.batch_alert) as b:
        b.add(wj.step, "x", log_file, fail=True)
    Job.objects.filter(workflow_id=b.id, name=wj.step.name).update(max_attempts=1)
    # The failure callback's job is gone from this worker's registry: its row fails, clearly.
    failure = Job.objects.get(workflow_id=b.id, args__kind="failure")
    Job.objects.filter(pk=failure.pk).update(args={**failure.args, "callback": "no.such.job"})
    workers.start("--concurrency", "2")
    wait_for(drained(*Job.objects.filter(workflow_id=b.id)), what="batch settled")
    assert b.workflow.name == name
    failed = Job.objects.get(pk=failure.pk)
    assert failed.status == "failed" and "batch callback 'no.such.job' is not a job this worker knows" in failed.error
    assert Job.objects.get(workflow_id=b.id, args__kind="complete").status == "completed"
    after = wj.step.perform_later("later", log_file)
    wait_for(lambda: status(after) == "completed", what="the worker lives on")


def test_finishing_a_job_without_children_sends_one_statement_and_a_parent_three_in_one_transaction():
    lone = wj.noop.perform_later(1)
    parent = wj.noop.perform_later(2)
    child = wj.noop.using(after=[parent]).perform_later(3)
    Job.objects.filter(pk__in=[lone.pk, parent.pk]).update(status="running", attempts=1)
    with connect("default", "test") as conn:
        conn.cursor_factory = CountingCursor
        CountingCursor.sent = []
        with conn.cursor() as cursor:
            assert finish(cursor, [Outcome(lone.pk, lone.name, 1, "completed", result="1")], None) == set()
        assert CountingCursor.sent == [sql.FINISH]
        CountingCursor.sent = []
        with conn.cursor() as cursor:
            assert finish(cursor, [Outcome(parent.pk, parent.name, 1, "completed", result="2")], None) == set()
        assert CountingCursor.sent == [sql.FINISH, sql.FINISH_PARENTS, dependencies.SETTLE]
    assert statuses([lone, parent, child]) == ["completed", "completed", "queued"]


def test_a_workflow_sends_job_enqueued_per_job_and_is_written_once():
    from axa_django.signals import job_enqueued

    seen = []

    def receiver(sender, job, **kwargs):
        seen.append((sender, job.pk))

    job_enqueued.connect(receiver)
    try:
        with workflow("signals") as wf:
            a = wf.add(wj.noop, 1)
            b = wf.add(wj.step, "b", "/dev/null", after=[a])
    finally:
        job_enqueued.disconnect(receiver)
    assert seen == [(wj.noop, a.pk), (wj.step, b.pk)]
    with pytest.raises(RuntimeError, match="start a new one"), wf:
        pass
