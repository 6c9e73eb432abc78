"""Per-queue pools: `runworker --queue emails:8 --queue default:4` in one process."""

from __future__ import annotations

import signal

import pytest

from axa_django.models import Job, Worker
from axa_django.worker.pools import split
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def done(jobs: list[Job]) -> int:
    return Job.objects.filter(pk__in=[job.pk for job in jobs], status="completed").count()


def test_each_queue_gets_its_own_pool_and_a_flood_in_one_never_starves_the_other(workers, tmp_path) -> None:
    log = tmp_path / "log"
    flood = [flow_jobs.chore.perform_later(f"d{i}", str(log), seconds=1.0) for i in range(6)]
    proc = workers.start("--queue", "flow-emails:3", "--queue", "flow-default:1")
    wait_for(lambda: Worker.objects.count() == 2, what="both pools to register")
    pools = {tuple(w.queues): (w.concurrency, w.pid) for w in Worker.objects.all()}
    assert pools == {("flow-emails",): (3, proc.pid), ("flow-default",): (1, proc.pid)}
    emails = [flow_jobs.email.perform_later(f"e{i}", str(log)) for i in range(9)]
    wait_for(lambda: done(emails) == 9, what="the emails to run beside the flood")
    assert done(flood) <= 3  # the default pool's one thread is still on its backlog
    # Between two chores the thread holds none for a moment: wait for the next to be held.
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in flood], status="running").count() == 1,
        what="the default pool's one thread on its next chore",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # the running chore finished first
    assert not Worker.objects.exists()


def test_burst_pools_drain_and_exit_0(workers) -> None:
    jobs = [flow_jobs.email.perform_later(f"e{i}") for i in range(5)]
    jobs += [flow_jobs.chore.perform_later(f"c{i}") for i in range(5)]
    # A queue named without a size beside sized ones gets --concurrency threads.
    done_proc = workers.manage("runworker", "--burst", "--queue", "flow-emails:2", "--queue", "flow-default")
    assert done_proc.returncode == 0, done_proc.stdout + done_proc.stderr
    assert done(jobs) == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "flow-emails:0"], "at least 1 thread"),
        (["--queue", "a:2", "--queue", "a:3"], "given twice"),
        (["--queue", "a:2", "--max-jobs", "3"], "--max-jobs"),
        (["--queue", " a:2"], "whitespace"),
    ],
)
def test_bad_pool_options_are_refused(workers, args: list[str], message: str) -> None:
    result = workers.manage("runworker", *args)
    assert result.returncode != 0 and message in result.stderr


def test_split_reads_a_trailing_size_only() -> None:
    assert split("emails:8") == ("emails", 8)
    assert split("emails") == ("emails", None)
    assert split("a:b") == ("a:b", None)
    assert split("a:1:8") == ("a:1", 8)
