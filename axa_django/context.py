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

import psycopg

from . import dependencies, sql
from .arguments import encode
from .exceptions import JobCancelled, JobLost, JobTimeout

# The largest result a job may store, as for a result returned (execution.perform).
RESULT_LIMIT = 2**31
_IN_TRANSACTION = psycopg.pq.TransactionStatus.INTRANS


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
    # When a thread started this attempt (epoch seconds): a row claimed ahead has no started_at yet.
    _started: float | None = field(default=None, repr=False)
    # The result text of the last complete_in_transaction(), and whether its transaction committed.
    _completion: str | None = field(default=None, repr=False)
    _committed: bool = field(default=False, repr=False)

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

    def complete_in_transaction(self, result: Any = None) -> None:
        """Complete this job, with ``result``, in the current ``transaction.atomic()`` block on the queue database.

        The row becomes ``completed`` in the same transaction as the job's own writes to
        that database: both commit, or neither does (the job then runs again), and once
        committed nothing can run the job again or overwrite its outcome. Children
        (``after=``) are settled in the same transaction. Raises JobLost, marking the
        block for rollback, if this attempt no longer owns its row (the worker lost it
        past its lease, someone deleted it, or it is already completed): let it
        propagate so that the writes are undone.
        """
        from django.db import connections, transaction

        from . import conf

        if _in_event_loop():
            raise RuntimeError(
                "complete_in_transaction() runs database statements, so call it from sync code: in an async job, "
                "inside the function you pass to sync_to_async, in its transaction.atomic() block"
            )
        text = encode(result, f"the result of job {self.name!r}", RESULT_LIMIT)
        alias = conf.queue_database()
        connection = connections[alias]
        if not connection.in_atomic_block:
            raise transaction.TransactionManagementError(
                f"complete_in_transaction() completes job {self.name!r} in the current transaction, so call it "
                f"inside transaction.atomic(using={alias!r}), the block that makes the job's writes to the queue's "
                "database; outside one it would commit on its own, apart from them"
            )
        started = self._started if self._started is not None else time.time()
        params = {"id": self.job_id, "worker": self.worker_id, "result": text, "started": started}
        with connection.cursor() as cursor:
            cursor.execute(sql.COMPLETE_SELF, params)
            row = cursor.fetchone()
            if row is None:
                cursor.execute("SELECT status, worker_id FROM axa_queue WHERE id = %s", [self.job_id])
                now = cursor.fetchone()
        if row is None:
            transaction.set_rollback(True, using=alias)
            raise JobLost(self._lost_message(now))
        if row[0]:
            with connection.cursor() as cursor:
                dependencies.settle(cursor, [self.job_id])
        self._completion, self._committed = text, False
        transaction.on_commit(self._on_commit, using=alias)

    def _on_commit(self) -> None:
        self._committed = True

    def _lost_message(self, now: tuple[Any, ...] | None) -> str:
        where = f"job {self.name!r} {self.job_id} (attempt {self.attempt}) cannot complete itself"
        undone = "The transaction is rolled back so that its writes are not kept"
        if now is None:
            return f"{where}: its row is gone (deleted or pruned). {undone}"
        if now[0] == "completed" and self._completion is not None and now[1] == self.worker_id:
            return f"{where}: this attempt completed it already (complete_in_transaction() was called twice). {undone}"
        if now[0] == "running":
            state = f"its row is running under another worker ({now[1]}): this worker lost it past its lease"
        else:
            state = f"its row is {now[0]} now (this worker lost it past its lease, or it was changed meanwhile)"
        return f"{where}: {state}. {undone}; the attempt that owns the row does the work"

    def completed_itself(self) -> bool:
        """True if this attempt's complete_in_transaction() is kept: committed, or inside the caller's transaction.

        A worker's job thread autocommits, so its completion is kept once committed. In
        immediate mode and run_jobs() (no worker id) the job runs in the caller's
        transaction: its completion is kept while that transaction still holds it.
        """
        if self._committed:
            return True
        if self._completion is None or self.worker_id is not None:
            return False
        from django.db import DatabaseError, connections

        from . import conf

        connection = connections[conf.queue_database()]
        raw = connection.connection
        if not connection.in_atomic_block or raw is None or raw.info.transaction_status != _IN_TRANSACTION:
            return False  # rolled back, or about to be (a failed statement aborted the transaction)
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT status = 'completed' FROM axa_queue WHERE id = %s", [self.job_id])
                row = cursor.fetchone()
        except DatabaseError:
            return False  # the caller's transaction is broken: it rolls the completion back
        return bool(row and row[0])

    def cancel(self) -> None:
        """Mark this job as asked to stop; the worker calls this when it sees the request."""
        self._cancelled.set()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
