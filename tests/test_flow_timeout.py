"""Timeouts: an attempt past its timeout fails with JobTimeout; a thread that will not stop is replaced."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading

import pytest

from axa_django import Job
from axa_django.execution.timeouts import Watch
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def burst(**options: object) -> Worker:
    options.setdefault("concurrency", 2)
    worker = Worker(burst=True, install_signals=False, **options)
    assert worker.run() == 0
    return worker


def reloaded(job: Job) -> Job:
    job.refresh_from_db()
    return job


def test_a_sync_job_past_its_timeout_fails_with_job_timeout_and_is_retried(tmp_path) -> None:
    log = tmp_path / "log"
    job = flow_jobs.sleepy.perform_later(30, str(log))
    quick = flow_jobs.sleepy.perform_later(0, None)
    burst()
    job = reloaded(job)
    assert job.status == "failed" and job.attempts == 2
    assert [entry["type"] for entry in job.errors] == [
        "axa_django.exceptions.JobTimeout",
        "axa_django.exceptions.JobTimeout",
    ]
    assert "ran past its timeout of 0.5s" in job.errors[0]["message"] and "JobTimeout" in job.error
    assert log.read_text().count("sleepy start") == 2 and "sleepy end" not in log.read_text()
    assert reloaded(quick).status == "completed"


def test_a_job_that_catches_job_timeout_and_returns_still_fails(tmp_path) -> None:
    log = tmp_path / "log"
    job = flow_jobs.stubborn.perform_later(str(log))
    burst()
    job = reloaded(job)
    assert job.status == "failed" and job.errors[-1]["type"] == "axa_django.exceptions.JobTimeout"
    assert log.read_text() == "caught\n" and job.result is None


def test_using_sets_a_timeout_per_call_and_the_row_keeps_it() -> None:
    job = flow_jobs.untimed.using(timeout=0.2).perform_later(30)
    fine = flow_jobs.untimed.perform_later(0.3)
    assert job.timeout == 0.2 and fine.timeout is None
    burst()
    assert reloaded(job).status == "failed" and reloaded(job).errors[0]["type"] == "axa_django.exceptions.JobTimeout"
    assert reloaded(fine).status == "completed"


def test_an_async_job_past_its_timeout_is_cancelled(tmp_path) -> None:
    log = tmp_path / "log"
    job = flow_jobs.async_sleepy.perform_later(30, str(log))
    burst()
    job = reloaded(job)
    assert job.status == "failed" and job.errors[-1]["type"] == "axa_django.exceptions.JobTimeout"
    assert log.read_text() == "async cancelled\n"


def test_the_context_exposes_the_deadline_from_the_database_clock() -> None:
    job = flow_jobs.deadline_of.perform_later()
    burst()
    job = reloaded(job)
    timeout, deadline = job.result
    assert job.status == "completed" and timeout == 0.5
    # The database's clock at the claim, plus the moments before a thread started it, plus 0.5 s.
    assert 0 <= deadline - (job.started_at.timestamp() + 0.5) < 1


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "5", True, 10**12])
def test_a_bad_timeout_is_refused_at_decoration_and_at_using(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="timeout"):
        flow_jobs.background_job(timeout=bad)(flow_jobs.mark)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="timeout"):
        flow_jobs.untimed.using(timeout=bad)
    assert not Job.objects.exists()


def test_a_watch_never_raises_outside_the_jobs_code() -> None:
    watch = Watch("j", 1, 0.1)
    watch.fire()  # no thread inside the job's code: nothing to raise in
    assert watch.leave() is True and watch.abandon() is True and watch.settle() is False
    settled = Watch("j", 1, 0.1)
    assert settled.settle() is True and settled.abandon() is False
    assert settled.deadline is None  # the clock starts with the job, not the claim
    settled.enter()
    assert settled.deadline is not None and settled.leave() is False


@contextlib.contextmanager
def a_fifo(path):
    """A named pipe at ``path`` (a job blocked reading it is stuck outside Python)."""
    os.mkfifo(path)
    yield path
    # Free a reader still blocked in open(), whatever the test did (ENXIO: there is none).
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def fifo(tmp_path):
    with a_fifo(tmp_path / "fifo") as path:
        yield path


def release(path) -> None:
    with contextlib.suppress(BrokenPipeError), open(path, "w") as writer:
        writer.write("late")  # the reader may have stopped at once: its JobTimeout was waiting


class Output:
    """A worker's output lines, read as they come."""

    def __init__(self, proc) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self.thread.start()

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


def test_a_thread_blocked_in_c_is_replaced_and_its_late_outcome_never_lands(workers, fifo) -> None:
    proc = workers.start("--concurrency", "2", "--timeout-grace", "0.2", "-v", "1")
    output = Output(proc)
    stuck = flow_jobs.blocked.perform_later(str(fifo))
    wait_for(lambda: reloaded(stuck).status == "failed", what="the stuck attempt to be given up")
    stuck = reloaded(stuck)
    assert stuck.errors[-1]["type"] == "axa_django.exceptions.JobTimeout" and "given up" in stuck.errors[-1]["message"]
    # The slot came back: both threads' worth of work still runs.
    others = [flow_jobs.untimed.perform_later(0.05) for _ in range(4)]
    wait_for(lambda: all(reloaded(job).status == "completed" for job in others), what="jobs on the new thread")
    release(fifo)
    wait_for(lambda: output.has("returned after it was given up; its outcome is dropped"), what="the late return")
    assert (fifo.parent / "fifo.log").read_text() == "returned\n"
    assert output.has("its thread is stuck; starting a new job thread") and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    stuck = reloaded(stuck)
    assert stuck.status == "failed" and stuck.result is None and len(stuck.errors) == 1


def test_a_worker_whose_threads_are_all_stuck_exits_1(workers, fifo) -> None:
    proc = workers.start("--concurrency", "1", "--timeout-grace", "0.2")
    stuck = flow_jobs.blocked.perform_later(str(fifo))
    assert proc.wait(timeout=60) == 1
    output = proc.stdout.read()
    assert "stuck in jobs past their timeout; exiting 1" in output
    assert "stopped because every job thread was stuck past its timeout" in output, output  # no thread "died"
    assert (
        reloaded(stuck).status == "failed" and reloaded(stuck).errors[-1]["type"] == "axa_django.exceptions.JobTimeout"
    )
