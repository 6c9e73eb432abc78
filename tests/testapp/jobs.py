"""Jobs the test suite enqueues; workers in subprocesses find them through jobs.py discovery."""

import asyncio
import gc
import os
import threading
import time
from pathlib import Path

from django.db import connection

from axa_django import JobCancelled, JobContext, background_job


def _mark(path: str | None, text: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


@background_job(name="CountWorker")
def count(fail: bool) -> None:
    """The seed's test job."""
    if fail:
        raise RuntimeError("told to fail")


@background_job
def add(a, b=0):  # type: ignore[no-untyped-def]
    # Unannotated: tests store any JSON value through it (annotations are checked at enqueue).
    return a + b


@background_job
def record(token: str, log: str) -> str:
    """Append token to a file so tests can count executions across processes."""
    _mark(log, token)
    return token


@background_job
def slow(seconds: float, log: str | None = None, token: str = "") -> str:
    _mark(log, f"start {token} {os.getpid()}")
    time.sleep(seconds)
    _mark(log, f"end {token} {os.getpid()}")
    return "slept"


@background_job(max_attempts=3, backoff=0)
def flaky(log: str) -> int:
    """Fails until it has run three times."""
    _mark(log, "run")
    runs = len(Path(log).read_text().splitlines())
    if runs < 3:
        raise ValueError(f"flaky run {runs}")
    return runs


@background_job(takes_context=True)
def with_context(context: JobContext, seconds: float = 0) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not context.is_cancelled():
        time.sleep(0.01)
    return {"attempt": context.attempt, "cancelled": context.is_cancelled(), "id": str(context.job_id)}


@background_job
def bad_result() -> object:
    return {1, 2}


@background_job
def trace(token: str, log: str, seconds: float = 0.0) -> None:
    """Run for a while, then log token and pid: who ran what, for the chaos tests."""
    time.sleep(seconds)
    _mark(log, f"{token} {os.getpid()}")


@background_job
def write_nothing(token: str, log: str) -> None:
    """A write a read-only server refuses, changing nothing; then log token."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE false")
    _mark(log, token)


@background_job(unique=lambda user_id: f"user:{user_id}")
def sync_user(user_id: int) -> int:
    """At most one queued or running per user."""
    return user_id


@background_job(queue="emails", priority=5)
def send_email(token: str, log: str) -> str:
    _mark(log, f"email {token}")
    return token


@background_job(max_attempts=3, backoff=0)
async def async_wait(seconds: float, cleanup: bool = False) -> str:
    """Sleeps; with cleanup, catches the CancelledError of a cancel and returns instead."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if cleanup:
            return "cleaned up"
        raise
    return "slept"


@background_job(takes_context=True, max_attempts=3, backoff=0)
def stoppable(context: JobContext, seconds: float = 120) -> str:
    """Ends as cancelled when asked to stop."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if context.is_cancelled():
            raise JobCancelled("stopped on request")
        time.sleep(0.01)
    return "finished"


def _wait_for_peers(log: str, token: str, peers: int, timeout: float = 30) -> None:
    """Log ``token``, then block until ``peers`` tokens are logged: only concurrent runs get past."""
    _mark(log, token)
    deadline = time.monotonic() + timeout
    while len(Path(log).read_text().split()) < peers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{token}: the other jobs never started alongside this one")
        time.sleep(0.01)


@background_job
async def async_rendezvous(log: str, token: str, peers: int) -> dict:
    """Waits on its own event loop until ``peers`` jobs are running at once."""
    _mark(log, token)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while len(Path(log).read_text().split()) < peers:
        if loop.time() > deadline:
            raise TimeoutError(f"{token}: the other jobs never started alongside this one")
        await asyncio.sleep(0.01)
    return {"loop": id(loop), "thread": threading.current_thread().name}


@background_job
async def async_orm_rendezvous(log: str, token: str, peers: int) -> dict:
    """Blocking sync code and the ORM through sync_to_async, as the docs recommend."""
    from asgiref.sync import sync_to_async

    from axa_django.models import Job

    def in_sync() -> dict:
        _wait_for_peers(log, token, peers)
        return {
            "thread": threading.current_thread().name,
            "jobs": Job.objects.filter(name__endswith="rendezvous").count(),
        }

    return await sync_to_async(in_sync)()


@background_job
async def async_orm_directly() -> int:
    """The sync ORM called straight from async code: Django refuses it."""
    from axa_django.models import Job

    return Job.objects.count()


if os.environ.get("AXA_TEST_CRON"):
    # Only the worker subprocesses of the cron tests know the every-second job, so
    # other tests' workers do not enqueue it.
    from . import cron_jobs  # noqa: F401
if os.environ.get("AXA_TEST_CONSOLE_CRON"):
    from . import console_cron_jobs  # noqa: F401  (the periodic jobs page's worker test)

# Jobs of the hardening tests, one module per area.
from . import (  # noqa: E402, F401
    admin_jobs,
    adminpolish_jobs,
    boundary_jobs,
    exactly_once_jobs,
    flow_jobs,
    hostile_jobs,
    housekeeping_jobs,
    ops_jobs,
    pooler_jobs,
    prefetch_jobs,
    setup12_jobs,
    testing12_jobs,
    timeout_inline_jobs,
    workermistakes_jobs,
    workflow_jobs,
)


@background_job
def frozen_objects() -> int:
    """How many objects the process froze out of the garbage collector (runworker freezes what it loaded)."""
    return gc.get_freeze_count()
