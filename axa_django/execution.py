"""Running one claimed job and recording its outcome: shared by the worker and immediate mode."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from asgiref.sync import async_to_sync
from django.db import connections

from . import conf, registry, sql
from .arguments import ArgumentsMismatch, encode, prepare_call
from .context import JobCancelled, JobContext, run_cancellable
from .signals import job_finished, job_started

logger = logging.getLogger("axa_django")


@dataclass
class Claimed:
    """A row this worker claimed."""

    id: uuid.UUID
    name: str
    args: Any
    attempt: int
    max_attempts: int | None
    backend: str | None = None
    context: JobContext | None = field(default=None, repr=False)


@dataclass
class Outcome:
    """What became of one attempt, ready for the FINISH statement."""

    id: uuid.UUID
    name: str
    attempt: int
    status: str
    error: str | None = None
    result: str | None = None
    entry: str | None = None
    delay: float = 0.0


def perform(job: Claimed, worker_id: uuid.UUID | None, resolve: Callable[[Claimed], Any] | None = None) -> Outcome:
    """Run one claimed job and return its outcome; never raises for the job's own errors."""
    function = resolve(job) if resolve else registry.get(job.name)
    try:
        if function is None:
            raise NoHandler(f"no handler for job {job.name!r} in this worker")
        try:
            args, kwargs = prepare_call(function.signature, job.args)
        except ArgumentsMismatch as error:
            shape = function.signature.replace(return_annotation=inspect.Signature.empty)
            raise ArgumentsMismatch(f"the arguments do not fit {job.name}{shape}: {error}") from None
        if function.takes_context:
            job.context = job.context or JobContext(job.id, job.name, job.attempt, worker_id)
            args.insert(0, job.context)
        value = function.func(*args, **kwargs)
        if asyncio.iscoroutine(value):
            # async_to_sync runs the loop on its own thread and sends the job's
            # sync_to_async calls back to this job thread (and its connection); under
            # asyncio.run they would all queue on one process-wide thread instead.
            value = async_to_sync(run_cancellable)(value, job.context)
        try:
            result = encode(value, f"the return value of job {job.name!r}", 2**31)
        except (TypeError, ValueError) as error:
            raise BadResult(str(error)) from None
    except (Exception, SystemExit) as error:  # noqa: BLE001 - a job's failure is data, not a crash
        return _failure(job, function, error, worker_id)
    return Outcome(job.id, job.name, job.attempt, "completed", result=result)


class NoHandler(LookupError):
    """No job of this name is registered in the worker."""


class BadResult(TypeError):
    """The job returned something that is not JSON."""


def _failure(job: Claimed, function: Any, error: BaseException, worker_id: uuid.UUID | None) -> Outcome:
    kind = type(error)
    text = "".join(traceback.format_exception(error))
    message = str(error) or kind.__name__
    entry = json.dumps(
        {
            "attempt": job.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "worker": str(worker_id) if worker_id else None,
            "type": f"{kind.__module__}.{kind.__qualname__}",
            "message": message,
            "traceback": text,
        }
    )
    if isinstance(error, JobCancelled):
        logger.info("job %s %s cancelled", job.name, job.id)
        return Outcome(job.id, job.name, job.attempt, "cancelled", error=text, entry=entry)
    allowed = job.max_attempts or (function.attempts_allowed if function else 1)
    permanent = function is None or isinstance(error, ArgumentsMismatch | BadResult | NoHandler)
    if not permanent and job.attempt < allowed:
        delay = max(0.0, function.retry_delay(job.attempt))
        logger.warning(
            "job %s %s failed (attempt %d of %d), retrying in %.1fs: %s",
            job.name,
            job.id,
            job.attempt,
            allowed,
            delay,
            message,
        )
        return Outcome(job.id, job.name, job.attempt, "queued", error=text, entry=entry, delay=delay)
    logger.error("job %s %s failed: %s", job.name, job.id, message)
    return Outcome(job.id, job.name, job.attempt, "failed", error=text, entry=entry)


def finish(cursor: psycopg.Cursor[Any], outcomes: list[Outcome], worker_id: uuid.UUID | None) -> set[uuid.UUID]:
    """Write outcomes in one statement; return the ids whose guard held."""
    cursor.execute(
        sql.FINISH,
        {
            "ids": [o.id for o in outcomes],
            "statuses": [o.status for o in outcomes],
            "errors": [o.error for o in outcomes],
            "results": [o.result for o in outcomes],
            "entries": [o.entry for o in outcomes],
            "delays": [o.delay for o in outcomes],
            "worker": worker_id,
        },
    )
    return {row[0] for row in cursor.fetchall()}


def run_inline(job: Any, function: registry.JobFunction[Any, Any]) -> None:
    """Run a just-written row now, in this thread and transaction (immediate mode)."""
    using = job._state.db or conf.get("DATABASE")
    claimed = Claimed(job.id, job.name, job.args, 0, job.max_attempts)
    with connections[using].cursor() as cursor:
        while True:
            cursor.execute(
                "UPDATE axa_queue SET status = 'running', started_at = now(), updated_at = now(), "
                "attempts = attempts + 1 WHERE id = %s AND status = 'queued' RETURNING attempts",
                [job.id],
            )
            row = cursor.fetchone()
            if row is None:
                break
            claimed.attempt = row[0]
            job_started.send(sender=function, job_id=job.id, name=job.name, attempt=claimed.attempt)
            outcome = perform(claimed, None)
            outcome.delay = 0.0  # immediate mode retries at once
            # Django's cursor wraps psycopg's; FINISH needs the raw one for arrays.
            finish(cursor.cursor, [outcome], None)
            send_finished(function, outcome)
            if outcome.status != "queued":
                break
    job.refresh_from_db(using=using)


def send_finished(function: Any, outcome: Outcome) -> None:
    job_finished.send(
        sender=function,
        job_id=outcome.id,
        name=outcome.name,
        attempt=outcome.attempt,
        status=outcome.status,
        error=outcome.error,
        result=json.loads(outcome.result) if outcome.result is not None else None,
    )


def tidy_connections() -> None:
    # Keep the job thread's Django connection across jobs (whatever CONN_MAX_AGE
    # says) unless the job left it broken or inside a transaction.
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block:
            continue
        if connection.errors_occurred or not connection.get_autocommit():
            if not connection.is_usable() or not connection.get_autocommit():
                connection.close()
            connection.errors_occurred = False
