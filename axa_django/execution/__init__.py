"""Running one claimed job and recording its outcome: shared by the worker and immediate mode."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
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

from .. import conf, dependencies, sql
from ..arguments import ArgumentsMismatch, encode, prepare_call
from ..context import JobCancelled, JobContext, JobTimeout, run_cancellable
from ..exceptions import BadResult, BadRow, LeakedTransaction, NoHandler, stored_type
from ..ops import tracing
from ..signals import job_finished, job_started
from .attempts import RAISE_INLINE, Attempt, JobFailed, Recorder
from .timeouts import Watch, alarm, attempt_timeout, call

logger = logging.getLogger("axa_django")

# The longest retry delay written: now() plus this stays a time Python can load.
MAX_DELAY_SECONDS = 1_000 * 365 * 86_400.0


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
    # The claim sends args as text: decoding happens in the job thread, where a row
    # that cannot be decoded fails on its own instead of breaking the claim.
    args_json: str | None = field(default=None, repr=False)
    # The attempt's timeout, set by the worker when the job has one (timeouts.py).
    watch: Watch | None = field(default=None, repr=False)
    # Claimed ahead of free threads: started_at is written once a thread starts it.
    unmarked: bool = False


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
    # When a thread started a row claimed ahead (epoch seconds): its started_at is written with the outcome.
    started: float | None = None
    # The job completed its row itself (JobContext.complete_in_transaction): nothing is left to write.
    self_completed: bool = False


@tracing.traced
def perform(job: Claimed, worker_id: uuid.UUID | None, resolve: Callable[[Claimed], Any]) -> Outcome:
    """Run one claimed job and return its outcome; never raises for the job's own errors.

    ``resolve`` finds what runs the row (a JobFunction, or a look-alike), None if nothing here can.
    """
    function = resolve(job)
    try:
        if function is None:
            raise NoHandler(f"no handler for job {job.name!r} in this worker")
        if job.args_json is not None:
            job.args, job.args_json = decode_args(job.args_json), None
        try:
            args, kwargs = prepare_call(function.signature, job.args)
        except ArgumentsMismatch as error:
            shape = function.signature.replace(return_annotation=inspect.Signature.empty)
            raise ArgumentsMismatch(f"the arguments do not fit {job.name}{shape}: {error}") from None
        if function.takes_context:
            job.context = job.context or JobContext(job.id, job.name, job.attempt, worker_id)
            job.context._started = time.time()
            args.insert(0, job.context)
        value = call(job.watch, function.func, args, kwargs)
        if asyncio.iscoroutine(value):
            # async_to_sync runs the loop on its own thread and sends the job's
            # sync_to_async calls back to this job thread (and its connection); under
            # asyncio.run they would all queue on one process-wide thread instead.
            value = async_to_sync(run_cancellable)(value, job.context)
        try:
            result = encode(value, f"the return value of job {job.name!r}", 2**31)
        except (TypeError, ValueError) as error:
            raise BadResult(str(error)) from None
    except BaseException as error:  # noqa: BLE001 - whatever a job raises is its outcome, never the worker's end
        if job.context is not None and job.context.completed_itself():
            return completed_itself(job, error)
        return failure(job, function, error, worker_id)
    if job.context is not None and job.context.completed_itself():
        return completed_itself(job)
    return Outcome(job.id, job.name, job.attempt, "completed", result=result)


def completed_itself(job: Claimed, raised: BaseException | None = None) -> Outcome:
    """The outcome of an attempt that completed its row itself: completed, with the result it stored.

    What it raised afterwards changes nothing (the row stays completed), and is logged.
    """
    assert job.context is not None
    if raised is not None:
        logger.warning(
            "job %s %s completed itself (complete_in_transaction) and then raised %s: %s; it stays completed",
            job.name,
            job.id,
            type(raised).__name__,
            raised,
        )
    return Outcome(job.id, job.name, job.attempt, "completed", result=job.context._completion, self_completed=True)


def decode_args(text: str) -> Any:
    """A row's args from their JSON text; BadRow (permanent) if Python cannot hold them."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRow("the row's args are nested too deeply for Python's JSON decoder") from None
    except ValueError as error:  # e.g. an integer of more digits than int() accepts
        raise BadRow(f"the row's args cannot be decoded: {error}") from None


def storable(text: str) -> str:
    """``text`` as PostgreSQL text can hold it: NUL and lone surrogates shown escaped, and said so."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00") + "\n(NUL characters, which PostgreSQL cannot store, are shown as \\x00)"
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode() + "\n(unpaired surrogates are shown escaped)"
    return text


def failure(job: Claimed, function: Any, error: BaseException, worker_id: uuid.UUID | None) -> Outcome:
    """The outcome of an attempt that raised ``error``: retried while attempts are left."""
    kind = type(error)
    text = storable("".join(traceback.format_exception(error)))
    try:
        message = storable(str(error) or kind.__name__)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = kind.__name__
    entry = json.dumps(
        {
            "attempt": job.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "worker": str(worker_id) if worker_id else None,
            "type": stored_type(kind),
            "message": message,
            "traceback": text,
        }
    )
    if isinstance(error, JobCancelled):
        logger.info("job %s %s cancelled", job.name, job.id)
        return Outcome(job.id, job.name, job.attempt, "cancelled", error=text, entry=entry)
    allowed = job.max_attempts or (function.attempts_allowed if function else 1)
    permanent = function is None or isinstance(error, ArgumentsMismatch | BadResult | BadRow | NoHandler)
    if not permanent and job.attempt < allowed:
        delay = _bounded(function.retry_delay(job.attempt))
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


def _bounded(delay: float) -> float:
    """A backoff's delay as a time Python can load: NaN and negatives are 0, infinity a thousand years."""
    return min(delay, MAX_DELAY_SECONDS) if delay >= 0 else 0.0


def _as_json(o: Outcome) -> str:
    error = "null" if o.error is None else json.dumps(o.error)
    result = "null" if o.result is None else '{"v":' + o.result + "}"
    started = "null" if o.started is None else repr(o.started)
    return (
        f'{{"id":"{o.id}","status":"{o.status}","delay":{o.delay!r},"error":{error},"result":{result},'
        f'"entry":{o.entry or "null"},"started":{started}}}'
    )


def finish(cursor: psycopg.Cursor[Any], outcomes: list[Outcome], worker_id: uuid.UUID | None) -> set[uuid.UUID]:
    """Write outcomes in one statement; return the ids whose guard held, and those of jobs that completed themselves."""
    done = {o.id for o in outcomes if o.self_completed}  # their transaction wrote them
    if done:
        outcomes = [o for o in outcomes if not o.self_completed]
        if not outcomes:
            return done
    # Rows are locked in id order, as an enqueue with after= locks its parents: no deadlock.
    outcomes = sorted(outcomes, key=lambda o: o.id)
    # One JSON text for the whole batch: result and entry are JSON already and go in
    # as they are, so nothing is encoded twice and psycopg adapts a single string.
    document = ",".join(map(_as_json, outcomes))
    cursor.execute(sql.FINISH, {"outcomes": f"[{document}]", "worker": worker_id})
    written = {row[0] for row in cursor.fetchall()}
    if len(written) < len(outcomes):  # jobs with children (or rescued meanwhile): see dependencies.py
        left = ",".join(_as_json(o) for o in outcomes if o.id not in written)
        params = {"outcomes": f"[{left}]", "worker": worker_id}
        written |= dependencies.finish_parents(cursor, sql.FINISH_PARENTS, params)
    return written | done


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


_TIMEOUT_TYPE = stored_type(JobTimeout)


def attempt_of(outcome: Outcome, raised: BaseException | None) -> Attempt:
    """The Attempt ``outcome`` records, ``raised`` being what the job's code raised.

    An attempt stopped at its timeout carries the JobTimeout it failed with, whatever
    its code raised meanwhile (CancelledError, or nothing if it caught the JobTimeout).
    """
    if outcome.entry is not None and not (isinstance(raised, JobTimeout) and raised.args):
        entry = json.loads(outcome.entry)
        if entry.get("type") == _TIMEOUT_TYPE:
            stopped = JobTimeout(entry.get("message"))
            if isinstance(raised, JobTimeout):  # raised from the class: keep where it landed
                stopped = stopped.with_traceback(raised.__traceback__)
            else:
                stopped.__context__ = raised
            raised = stopped
    return Attempt.of(outcome, raised)


def send_finished(function: Any, outcome: Outcome, robust: bool = False) -> None:
    """Send job_finished; ``robust``: log a receiver's exception instead of raising it (the worker)."""
    send = job_finished.send_robust if robust else job_finished.send
    responses = send(
        sender=function,
        job_id=outcome.id,
        name=outcome.name,
        attempt=outcome.attempt,
        status=outcome.status,
        error=outcome.error,
        result=json.loads(outcome.result) if outcome.result is not None else None,
    )
    if robust:
        log_receiver_errors("job_finished", responses)


def log_receiver_errors(signal_name: str, responses: list[tuple[Any, Any]]) -> None:
    """Log the exceptions that ``send_robust`` collected from receivers."""
    for receiver, response in responses:
        if isinstance(response, BaseException):
            logger.error("a %s receiver (%r) raised", signal_name, receiver, exc_info=response)


def release_connections() -> list[str]:
    """Leave this thread's Django connections clean for the next job; describe any transaction the job left open.

    A connection is kept across jobs (whatever CONN_MAX_AGE says) while it is clean.
    One left inside a transaction (``BEGIN`` by hand, an ``atomic()`` never exited,
    ``set_autocommit(False)``) is closed, which rolls the transaction back, and dropped,
    so the next job gets a fresh one and cannot commit the leak by accident.
    """
    leaks = []
    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if raw is None:
            continue
        open_block = connection.in_atomic_block or not connection.get_autocommit()
        status = raw.info.transaction_status if not raw.closed else psycopg.pq.TransactionStatus.IDLE
        if open_block or status != psycopg.pq.TransactionStatus.IDLE:
            leaks.append(connection.alias)
            with contextlib.suppress(psycopg.Error):
                raw.close()
            del connections[connection.alias]
        elif connection.errors_occurred:
            if not connection.is_usable():
                connection.close()
            connection.errors_occurred = False
    return leaks


def leaked(job: Claimed, function: Any, outcome: Outcome, aliases: list[str], worker_id: uuid.UUID | None) -> Outcome:
    """The outcome of an attempt that left a transaction open: it fails, whatever it returned."""
    names = ", ".join(repr(alias) for alias in aliases)
    if outcome.self_completed:  # its completion committed before: the row stays completed
        logger.warning(
            "job %s %s completed itself, then left a transaction open on %s (rolled back)", job.name, job.id, names
        )
        return outcome
    message = (
        f"the job returned with a transaction still open on database {names}; it was rolled back, so what the job "
        "wrote there is lost. Commit inside the job (transaction.atomic()) before returning."
    )
    if outcome.status != "completed":
        message += f" The job had also failed: {json.loads(outcome.entry or '{}').get('message', outcome.status)}"
    return failure(job, function, LeakedTransaction(message), worker_id)
