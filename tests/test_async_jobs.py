"""async def background jobs: each runs on its own event loop without holding up other jobs."""

import pytest
from asgiref.sync import async_to_sync

from axa_django import Job
from axa_django.worker import Worker
from tests.conftest import AXA_APPS
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def burst(concurrency: int) -> Worker:
    worker = Worker(burst=True, install_signals=False, concurrency=concurrency)
    assert worker.run() == 0
    return worker


def test_async_jobs_run_side_by_side_each_on_its_own_loop(log_file):
    # Each job waits until all three have started: they finish only if they run at once.
    rows = [jobs.async_rendezvous.perform_later(log_file, f"t{i}", 3) for i in range(3)]
    assert burst(concurrency=3).processed == 3
    done = [Job.objects.get(pk=row.pk) for row in rows]
    assert [row.status for row in done] == ["completed"] * 3, [row.error for row in done]
    assert len({row.result["loop"] for row in done}) == 3
    assert len({row.result["thread"] for row in done}) == 3


def test_sync_code_and_the_orm_via_sync_to_async_run_on_each_jobs_own_thread(log_file):
    # sync_to_async (thread_sensitive, its default) comes back to the job's thread: two
    # blocking calls proceed side by side rather than queueing on one shared thread.
    rows = [jobs.async_orm_rendezvous.perform_later(log_file, f"t{i}", 2) for i in range(2)]
    assert burst(concurrency=2).processed == 2
    done = [Job.objects.get(pk=row.pk) for row in rows]
    assert [row.status for row in done] == ["completed"] * 2, [row.error for row in done]
    threads = {row.result["thread"] for row in done}
    assert len(threads) == 2 and all(name.startswith("axa-job-") for name in threads), threads
    assert [row.result["jobs"] for row in done] == [2, 2]


def test_the_sync_orm_called_directly_from_an_async_job_fails_clearly():
    row = jobs.async_orm_directly.perform_later()
    burst(concurrency=1)
    row.refresh_from_db()
    assert row.status == "failed"
    assert row.errors[0]["type"] == "django.core.exceptions.SynchronousOnlyOperation"
    assert "use a thread or sync_to_async" in row.error


def test_aperform_later_from_async_code():
    async def view() -> Job:
        return await jobs.add.aperform_later(1, b=2)

    row = async_to_sync(view)()
    assert isinstance(row, Job) and row.status == "queued" and Job.objects.filter(pk=row.pk).exists()
    burst(concurrency=1)
    row.refresh_from_db()
    assert (row.status, row.result) == ("completed", 3)


def test_an_async_job_runs_under_a_real_runworker(workers, log_file):
    rows = [jobs.async_rendezvous.perform_later(log_file, f"p{i}", 2) for i in range(2)]
    proc = workers.start("--burst", "--concurrency", "2")
    assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert sorted(Job.objects.get(pk=row.pk).status for row in rows) == ["completed", "completed"]
