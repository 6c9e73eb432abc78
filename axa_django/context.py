"""JobContext: what a running job may ask about itself."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import threading
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobContext:
    """Passed as the first argument to jobs declared with ``takes_context=True``."""

    job_id: uuid.UUID
    name: str
    attempt: int
    worker_id: uuid.UUID | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)
    # When this attempt times out (database clock), None without a timeout.
    deadline: datetime.datetime | None = None
    # Seconds this attempt may run, None without a timeout.
    timeout: float | None = None
    # The same moment on this process's monotonic clock, which the worker enforces.
    _deadline_monotonic: float | None = field(default=None, repr=False)

    def is_cancelled(self) -> bool:
        """True once someone asked this job to stop (``job.cancel()`` on a running job)."""
        return self._cancelled.is_set()

    def timed_out(self) -> bool:
        """True once this attempt has run past its timeout."""
        return self._deadline_monotonic is not None and time.monotonic() >= self._deadline_monotonic

    def parent_results(self) -> dict[uuid.UUID, Any]:
        """The return values of this job's parents (after=), by parent id, oldest parent first.

        A parent that did not complete (it failed, or was cancelled, and this job runs
        anyway) maps to None; a parent pruned meanwhile is left out.
        """
        from django.db import connections

        from . import conf  # lazily: settings.py may import axa_django, and this needs settings

        # The statement is dependencies.PARENT_RESULTS; spelled here, as context sits below it.
        with connections[conf.queue_database()].cursor() as cursor:
            cursor.execute(
                "SELECT q.id, q.status, q.result::text FROM axa_dependency d JOIN axa_queue q ON q.id = d.parent_id "
                "WHERE d.child_id = %s ORDER BY q.created_at, q.id",
                [self.job_id],
            )
            rows = cursor.fetchall()
        return {
            job_id: json.loads(text) if status == "completed" and text is not None else None
            for job_id, status, text in rows
        }

    def cancel(self) -> None:
        """Mark this job as asked to stop; the worker calls this when it sees the request."""
        self._cancelled.set()


class JobTimeout(BaseException):
    """An attempt ran past its ``timeout``: raised in the job's thread, or its task cancelled.

    A BaseException, as asyncio.CancelledError is, so that a job's ``except Exception``
    does not swallow it; the attempt fails with it (and is retried per max_attempts).
    """

    __module__ = "axa_django"


class JobCancelled(Exception):
    """Raise from a job to end it as ``cancelled``; an async job stopped by ``cancel()`` ends with it."""


async def run_cancellable(coro: Coroutine[Any, Any, Any], context: JobContext | None, poll: float = 0.05) -> Any:
    """Await ``coro``; once ``context`` is cancelled, cancel it (CancelledError inside the job)."""
    if context is None:
        return await coro
    task = asyncio.ensure_future(coro)
    while not task.done():
        # Polling the thread-safe flag: cheap, and needs no loop of the worker's own.
        await asyncio.wait({task}, timeout=poll)
        if context.timed_out() and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):  # whatever the cancelled job ends with, it timed out
                await task
            raise JobTimeout(timeout_message(context))
        if context.is_cancelled() and not task.done():
            task.cancel()
            try:
                return await task  # the job may catch CancelledError and still return
            except asyncio.CancelledError:
                raise JobCancelled("the job was cancelled while running (job.cancel())") from None
    return task.result()


def timeout_message(context: JobContext) -> str:
    """What a JobTimeout says."""
    return timeout_text(context.name, context.attempt, context.timeout)


def timeout_text(name: str, attempt: int, timeout: float | None) -> str:
    """What a JobTimeout says."""
    return f"attempt {attempt} of job {name!r} ran past its timeout of {timeout or 0:g}s and was stopped"
