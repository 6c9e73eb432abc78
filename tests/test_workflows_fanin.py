"""Fan-out/fan-in at scale with 3 workers x 4 threads, and last parents ending together on different workers."""

import time

import pytest
from django.db import connection

from axa_django import Job
from tests.conftest import AXA_APPS, wait_for
from tests.test_workflows import lines
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

CHILDREN = 10_000


def start_pool(workers, n: int = 3, threads: int = 4) -> None:
    for _ in range(n):
        workers.start("--concurrency", str(threads))


@pytest.mark.halved
def test_ten_thousand_children_fan_out_and_the_fan_in_runs_once_after_the_last(workers, log_file):
    root = wj.noop.perform_later(0)
    started = time.perf_counter()
    children = wj.noop.using(after=[root]).perform_later_many([{"i": i} for i in range(CHILDREN)])
    enqueue = time.perf_counter() - started
    summary = wj.fan_in.using(after=children).perform_later(log_file)
    assert summary.status == "waiting" and summary.pending_parents == CHILDREN
    assert Job.objects.filter(status="waiting").count() == CHILDREN + 1
    began = time.perf_counter()
    start_pool(workers)
    wait_for(lambda: Job.objects.get(pk=summary.pk).status == "completed", timeout=240, what="fan-in")
    drain = time.perf_counter() - began
    assert lines(log_file) == ["fan-in"]
    row = Job.objects.get(pk=summary.pk)
    assert row.attempts == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), max(finished_at), count(*) FILTER (WHERE attempts <> 1) FROM axa_queue "
            "WHERE name = %s AND status = 'completed' AND id <> %s",
            [wj.noop.name, root.pk],
        )
        done, last, repeated = cursor.fetchone()
    assert done == CHILDREN and repeated == 0
    assert row.started_at >= last
    lag = (row.started_at - last).total_seconds()
    print(
        f"\nenqueue of {CHILDREN} children with one after=: {enqueue:.3f}s ({CHILDREN / enqueue:,.0f} jobs/s); "
        f"drain by 3 workers x 4 threads: {drain:.2f}s ({CHILDREN / drain:,.0f} jobs/s incl. startup); "
        f"last child to fan-in start: {lag * 1000:.0f} ms"
    )


@pytest.mark.halved
def test_last_parents_ending_together_on_different_workers_release_each_child_exactly_once(workers, log_file):
    # Twelve parents per child, all sleeping until the same instant, on three workers of
    # four threads: the last ones end in concurrent transactions (the race that loses or
    # doubles chord callbacks elsewhere). Each child must run exactly once.
    rounds = 8
    start_pool(workers)
    wait_for(lambda: connection.cursor().execute("SELECT count(*) FROM axa_worker").fetchone()[0] == 3, what="workers")
    at = time.time() + 1.0
    children = []
    for r in range(rounds):
        parents = wj.until.perform_later_many([{"at": at + r * 0.25, "token": f"{r}.{p}"} for p in range(12)])
        children.append(wj.fan_in.using(after=parents).perform_later(log_file))
    wait_for(
        lambda: Job.objects.filter(pk__in=[c.pk for c in children], status="completed").count() == rounds,
        timeout=60,
        what="every fan-in",
    )
    assert lines(log_file) == ["fan-in"] * rounds
    assert set(Job.objects.filter(pk__in=[c.pk for c in children]).values_list("attempts", "pending_parents")) == {
        (1, 0)
    }
    with connection.cursor() as cursor:
        # The parents of each round did end on more than one worker, within moments of each other.
        cursor.execute(
            "SELECT count(DISTINCT worker_id), extract(epoch FROM max(finished_at) - min(finished_at)) FROM axa_queue "
            "WHERE name = %s GROUP BY args->>'at'",
            [wj.until.name],
        )
        spread = cursor.fetchall()
    assert all(count > 1 for count, _ in spread)
    print("\nworkers per round, seconds between first and last parent end:", spread)


@pytest.mark.halved
def test_fan_ins_enqueued_while_workers_finish_their_parents_run_once_after_all(workers, log_file):
    # The usual order in real code: the rows are already running when the fan-in is
    # enqueued. Its enqueue locks the parents in id order and the finishers lock theirs
    # in id order too, so neither waits on the other in a circle (a deadlock otherwise).
    start_pool(workers)
    rows = wj.noop.perform_later_many([{"i": i} for i in range(4000)])
    wait_for(lambda: Job.objects.filter(status="completed").exists(), what="first rows done")
    fan_ins = [wj.fan_in.using(after=rows).perform_later(log_file) for _ in range(8)]
    ids = [f.pk for f in fan_ins]
    wait_for(lambda: Job.objects.filter(pk__in=ids, status="completed").count() == 8, timeout=120, what="fan-ins")
    assert lines(log_file) == ["fan-in"] * 8
    last = max(Job.objects.filter(pk__in=[r.pk for r in rows]).values_list("finished_at", flat=True))
    assert min(Job.objects.filter(pk__in=ids).values_list("started_at", flat=True)) >= last
