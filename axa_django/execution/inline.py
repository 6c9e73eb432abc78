"""Attempts run in the caller's own thread and transaction: immediate mode and ``axa_django.testing.run_jobs()``."""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

import psycopg
from django.db import connections

from .. import conf
from ..context import JobContext
from ..signals import job_started
from . import Claimed, Outcome, attempt_of, finish, perform, send_finished
from .attempts import RAISE_INLINE, JobFailed, Recorder
from .timeouts import Watch, alarm, attempt_timeout


def run_inline(job: Any, function: Any) -> None:
    """Run a just-written row now with ``function`` (its JobFunction), in this thread and transaction (immediate mode).

    Inside ``axa_django.testing.raise_failures()`` a job that ends failed raises JobFailed.
    """
    using = job._state.db or conf.get("DATABASE")
    recorder = Recorder(function)
    outcome = None
    with connections[using].cursor() as cursor:
        while True:
            cursor.execute(
                "UPDATE axa_queue SET status = 'running', started_at = now(), updated_at = now(), "
                "attempts = attempts + 1 WHERE id = %s AND status = 'queued' RETURNING attempts, timeout",
                [job.id],
            )
            row = cursor.fetchone()
            if row is None:
                break
            claimed = Claimed(job.id, job.name, job.args, row[0], job.max_attempts)
            job_started.send(sender=function, job_id=job.id, name=job.name, attempt=claimed.attempt)
            outcome = perform_here(claimed, recorder, row[1], using)
            outcome.delay = 0.0  # immediate mode retries at once
            # Django's cursor wraps psycopg's; FINISH needs the raw one for arrays.
            finish(cursor.cursor, [outcome], None)
            send_finished(function, outcome)
            if outcome.status != "queued":
                break
    job.refresh_from_db(using=using)
    if outcome is not None and outcome.status == "failed" and RAISE_INLINE.get():
        attempt = attempt_of(outcome, recorder.raised)
        raise JobFailed([attempt]) from attempt.exception


def perform_here(job: Claimed, function: Any, row_timeout: Any, using: str) -> Outcome:
    """``perform`` in this thread, on the caller's connection ``using`` (immediate mode, ``run_jobs()``).

    ``function`` runs the row (a JobFunction or look-alike, None if nothing can);
    ``row_timeout`` is the row's ``timeout`` column. The timeout is kept as a worker
    keeps it: an alarm raises JobTimeout in the job's code at the deadline (an async
    job's task is cancelled). Nothing is given up after a grace, as the caller waits
    for its job: one blocked in C ends failed with JobTimeout once it returns.

    Inside an atomic block the job runs in a savepoint: a statement of the job that
    failed (or that its JobTimeout cut short) is rolled back to where the job began, so
    the caller's transaction goes on, as a worker's autocommitting connection would.
    """
    timeout = attempt_timeout(row_timeout, function, job.backend)
    if timeout is not None:
        needs_context = job.backend is not None or getattr(function, "takes_context", False)
        if job.context is None and (needs_context or getattr(function, "is_async", False)):
            # An async job's timeout is kept through its context (run_cancellable), as in the worker.
            job.context = JobContext(job.id, job.name, job.attempt, None)
        job.watch = Watch(job.name, job.attempt, timeout, datetime.datetime.now(datetime.UTC), job.context)
    connection = connections[using]
    # The connection's own savepoint API: transaction.savepoint() is deprecated in Django 6.1.
    savepoint = connection.savepoint()  # None outside an atomic block
    restored = False
    if job.watch is None:
        outcome = perform(job, None, lambda _job: function)
    else:
        wire = _Wire()
        with alarm(job.watch, wire.locks, wire.cancel):
            outcome = perform(job, None, lambda _job: function)
        restored = job.watch.fired_at is not None and wire.restore(connection, savepoint)
    if savepoint is not None and not restored:
        raw = connection.connection
        if raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            # A statement of the job failed and aborted the caller's transaction; a worker's
            # connection autocommits, so go back to before the job to record its outcome.
            connection.savepoint_rollback(savepoint)
        else:
            connection.savepoint_commit(savepoint)
    return outcome


class _Wire:
    """This thread's database connections during one attempt, as its alarm (another thread) sees them."""

    def __init__(self) -> None:
        # Django's connections are this thread's own: keep them for the alarm's thread.
        self.wrappers = connections.all()
        self.before = [_transaction(wrapper) for wrapper in self.wrappers]

    def _open(self) -> list[psycopg.Connection[Any]]:
        raws = (wrapper.connection for wrapper in self.wrappers)
        return [raw for raw in raws if raw is not None and not raw.closed]

    def locks(self) -> list[Any]:
        """The locks psycopg takes around every call on the wire."""
        return [raw.lock for raw in self._open()]

    def cancel(self) -> None:
        """Cancel the statements running at the deadline (psycopg's cancel is safe from any thread)."""
        for raw in self._open():
            if raw.lock.locked():
                with contextlib.suppress(psycopg.Error):
                    raw.cancel_safe(timeout=5)

    def restore(self, connection: Any, savepoint: str | None) -> bool:
        """Undo what a JobTimeout left half done in Django's transaction code; True if ``savepoint`` was used.

        JobTimeout can land between two steps of ``atomic()`` (autocommit turned off,
        the block not yet marked): the worker drops such a connection, but the caller
        goes on with its own. Put each connection's transaction back as it was before.
        """
        rolled_back = False
        for wrapper, before in zip(self.wrappers, self.before, strict=True):
            raw = wrapper.connection
            if raw is None or raw.closed or _transaction(wrapper) == before:
                continue
            autocommit, blocks, savepoints, needs_rollback = before
            del wrapper.atomic_blocks[blocks:]
            del wrapper.savepoint_ids[savepoints:]
            wrapper.in_atomic_block = bool(wrapper.atomic_blocks)
            if autocommit and not blocks:
                raw.rollback()  # what the job began, as closing the connection would
                wrapper.run_on_commit = []
                wrapper.needs_rollback = False
                wrapper.set_autocommit(True)
            elif wrapper is connection and savepoint is not None:
                wrapper.savepoint_rollback(savepoint)
                wrapper.needs_rollback = needs_rollback
                rolled_back = True
            else:  # a transaction we cannot tell the state of: the caller's atomic() must roll it back
                wrapper.needs_rollback = True
        return rolled_back


def _transaction(wrapper: Any) -> tuple[bool, int, int, bool]:
    """Django's view of a connection's transaction: autocommit, atomic blocks, savepoints, needs_rollback."""
    if wrapper.connection is None:  # not connected: it will connect in autocommit
        return (True, 0, 0, False)
    return (wrapper.autocommit, len(wrapper.atomic_blocks), len(wrapper.savepoint_ids), wrapper.needs_rollback)
