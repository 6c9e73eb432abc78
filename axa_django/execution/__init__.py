"""Running one claimed job and recording its outcome: shared by the worker and immediate mode."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from asgiref.sync import async_to_sync
from django.db import connections
from django.db.backends.signals import connection_created

from .. import conf, dependencies, sql
from ..arguments import ArgumentsMismatch, encode, prepare_call
from ..context import JobCancelled, JobContext, JobTimeout, run_cancellable
from ..exceptions import BadResult, BadRow, LeakedTransaction, NoHandler, stored_type
from ..ops import tracing
from ..signals import job_finished
from ..sql import refused
from . import dberrors
from .attempts import Attempt
from .timeouts import Watch, call

logger = logging.getLogger("axa_django")

# The longest retry delay written: now() plus this stays a time Python can load.
MAX_DELAY_SECONDS = 1_000 * 365 * 86_400.0


@dataclass(slots=True)
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
    # Claimed within its queue's fleet-wide limit (axa_queue_limit): its end frees a slot.
    limited_queue: bool = False


@dataclass(slots=True)
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
    # Lost to the database (its connection died under it): the default max_losses, for
    # FINISH to count a loss instead of an attempt; None for any other outcome. FINISH
    # may fail the job (max_losses reached): the finisher then sets status to "failed".
    lost: int | None = None
    # Of a lost attempt: whether the job had attempts left, should the loss not be stored
    # (the finisher then spends the attempt as any other's, so the job cannot run for ever).
    attempts_left: bool = True
    # Its job was claimed within its queue's fleet-wide limit: once written, a slot is free.
    frees_queue_slot: bool = False


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
        if value is not None and asyncio.iscoroutine(value):
            # async_to_sync runs the loop on its own thread and sends the job's
            # sync_to_async calls back to this job thread (and its connection); under
            # asyncio.run they would all queue on one process-wide thread instead.
            value = async_to_sync(run_cancellable)(value, job.context)
        if value is None:
            result = "null"  # what most jobs return: no checks or encoder (a drain's worker CPU, measured)
        else:
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


# PostgreSQL writes jsonb as text with nothing around it: raw_decode reads that at a
# third of json.loads' cost, which first and last looks for whitespace with a regex.
_DECODER = json.JSONDecoder()


def decode_args(text: str) -> Any:
    """A row's args from their JSON text; BadRow (permanent) if Python cannot hold them."""
    try:
        try:
            value, end = _DECODER.raw_decode(text)
            if end == len(text):
                return value
        except ValueError:
            pass
        return json.loads(text)  # text with whitespace around it, or the error to report
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
    # A worker's attempt only: inline, the connection is the caller's, and its transaction died with it.
    if worker_id is not None and dberrors.database_lost(error):
        return lost(job, message, text, worker_id, attempts_left=job.attempt < allowed)
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


LOST_TYPE = "DatabaseLost"
# The most a loss count may be: FINISH reads the outcome's "lost" as a PostgreSQL int.
MOST_LOSSES = 2**31 - 2


def lost(job: Claimed, message: str, text: str, worker_id: uuid.UUID | None, *, attempts_left: bool = True) -> Outcome:
    """The outcome of an attempt whose database connection died under it (``message``: what it raised):
    queued again, its attempt given back and a loss counted (FINISH fails it past max_losses), as for
    a worker that died. The worker says what became of it once FINISH wrote it (worker/jobs.py)."""
    reason = " ".join(message.split())
    entry = json.dumps(
        {
            "attempt": job.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "worker": str(worker_id) if worker_id else None,
            "type": LOST_TYPE,
            # FINISH writes the message with the loss's count; this one stays if it cannot.
            "message": f"the job's database connection was lost ({reason})",
            "traceback": text,
        }
    )
    allowed = min(int(conf.get("MAX_LOSSES")), MOST_LOSSES)
    return Outcome(
        job.id, job.name, job.attempt, "queued", error=text, entry=entry, lost=allowed, attempts_left=attempts_left
    )


def _bounded(delay: float) -> float:
    """A backoff's delay as a time Python can load: NaN and negatives are 0, infinity a thousand years."""
    return min(delay, MAX_DELAY_SECONDS) if delay >= 0 else 0.0


def _as_json(o: Outcome) -> str:
    # The id as 32 hex digits, which uuid input takes: a quarter of the cost of str(UUID).
    error = "null" if o.error is None else json.dumps(o.error)
    result = "null" if o.result is None else '{"v":' + o.result + "}"
    started = "null" if o.started is None else repr(o.started)
    lost = "" if o.lost is None else f',"lost":{o.lost}'
    return (
        f'{{"id":"{o.id.hex}","status":"{o.status}","delay":{o.delay!r},"error":{error},"result":{result},'
        f'"entry":{o.entry or "null"},"started":{started}{lost}}}'
    )


def finish(
    cursor: psycopg.Cursor[Any], outcomes: list[Outcome], worker_id: uuid.UUID | None, *, only_lost: bool = False
) -> set[uuid.UUID]:
    """Write outcomes in one statement; return the ids of those not written (their rows were rescued or changed).

    A retry that did not end queued gets the status it ended with (failed through max_losses,
    cancelled by the requeue guard); ``only_lost``: only attempts lost to the database, whose
    job threads wait for the write (the others' threads report theirs meanwhile, unchanged).
    Jobs that completed themselves were written by their own transaction.
    """
    if any(o.self_completed for o in outcomes):
        outcomes = [o for o in outcomes if not o.self_completed]
        if not outcomes:
            return set()
    # Rows are locked in id order, as an enqueue with after= locks its parents: no deadlock.
    outcomes = sorted(outcomes, key=lambda o: o.id.int)  # UUID order; its __lt__ is Python, .int is not
    # Prepared at once where prepared statements are on (a finisher): past psycopg's threshold,
    # each connection planned it five times first (3 ms each), in every worker process.
    prepare = True if cursor.connection.prepare_threshold is not None else None
    if all(o.status == "completed" and o.result == "null" and o.entry is None for o in outcomes):
        # Jobs that returned None: their ids and start times say all (sql.FINISH_COMPLETED).
        ids = ",".join([o.id.hex for o in outcomes])
        started = ",".join(["NULL" if o.started is None else repr(o.started) for o in outcomes])
        params = {"ids": f"{{{ids}}}", "started": f"{{{started}}}", "worker": worker_id}
        cursor.execute(sql.FINISH_COMPLETED, params, prepare=prepare)
    else:
        # One JSON text for the whole batch: result and entry are JSON already and go in
        # as they are, so nothing is encoded twice and psycopg adapts a single string.
        document = ",".join(map(_as_json, outcomes))
        cursor.execute(sql.FINISH, {"outcomes": f"[{document}]", "worker": worker_id}, prepare=prepare)
    row = cursor.fetchone()
    unwritten = set(row[1]) if row is not None and row[1] else set()
    if row is not None and row[2]:  # retries that did not end queued (failed, cancelled)
        _ended(outcomes, {uuid.UUID(job_id): status for job_id, status in row[2]}, only_lost)
    if unwritten:  # jobs with children (or rescued meanwhile): see dependencies.py
        left = [o for o in outcomes if o.id in unwritten]
        params = {"outcomes": f"[{','.join(map(_as_json, left))}]", "worker": worker_id}
        with cursor.connection.transaction():  # FINISH_PARENTS and the settle of their children at once
            cursor.execute(sql.FINISH_PARENTS, params)
            rows = cursor.fetchall()
            written = {job_id for job_id, *_ in rows}
            dependencies.settle(cursor, written)
        unwritten -= written
        _ended(left, {job_id: status for job_id, _, status in rows if status not in (None, "queued")}, only_lost)
    return unwritten


def _ended(outcomes: list[Outcome], statuses: dict[uuid.UUID, str], only_lost: bool) -> None:
    for outcome in outcomes if statuses else ():
        status = statuses.get(outcome.id)
        if status is not None and (outcome.lost is not None or not only_lost):
            outcome.status = status


def finish_in_place(cursor: psycopg.Cursor[Any], outcome: Outcome, worker_id: uuid.UUID | None, why: str) -> str | None:
    """Write a finished outcome whose move into the history was refused, in place, saying why; the status
    it ended with (a retry whose cancel was asked: cancelled), None if not written (the row changed).

    In a transaction of its own: ``axa.in_place`` holds for this transaction only.
    """
    with cursor.connection.transaction():
        # This row only: children its settle cancels move into the history as usual.
        cursor.execute(refused.IN_PLACE_ROW, {"id": outcome.id})
        cursor.execute(refused.FINISH_IN_PLACE, {"outcomes": f"[{_as_json(outcome)}]", "worker": worker_id})
        rows = cursor.fetchall()
        if not rows:
            return None
        status: str = rows[0][1]
        if status != "queued":
            cursor.execute(refused.NOTE, {"id": outcome.id, "type": refused.REFUSED_TYPE, "message": refused.note(why)})
            dependencies.settle(cursor, [outcome.id])
    return status


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
    if not job_finished.receivers:
        return  # nothing listens: no receiver needs the result decoded (a cost per job)
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


class _Connected(threading.local):
    """Whether this thread has ever opened a Django connection (none: nothing to release)."""

    opened = False


_connected = _Connected()


def _opened(**_kwargs: Any) -> None:
    _connected.opened = True


# Django sends connection_created in the thread that connects. Asking Django's handler
# for the thread's connections costs 2.3 us a job (two exceptions raised and caught per
# alias), a twentieth of a no-op job's worker CPU: a thread that never connected skips it.
connection_created.connect(_opened, dispatch_uid="axa_django.execution.opened", weak=False)


def release_connections() -> list[str]:
    """Leave this thread's Django connections clean for the next job; describe any transaction the job left open.

    A connection is kept across jobs (whatever CONN_MAX_AGE says) while it is clean.
    One left inside a transaction (``BEGIN`` by hand, an ``atomic()`` never exited,
    ``set_autocommit(False)``) is closed, which rolls the transaction back, and dropped,
    so the next job gets a fresh one and cannot commit the leak by accident.
    """
    if not _connected.opened:
        return []
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
