"""What a worker does besides running jobs: enqueue periodic jobs and prune old ones.

``run(worker)`` is called from the worker's maintenance thread (worker/maintenance.py; a burst
worker's dispatcher calls it itself); it uses the calling thread's Django connection,
and only when there is something to do, so a worker with no periodic jobs and no
RETENTION opens no extra connection. Each step runs in its own transaction under
``SET LOCAL`` lock and statement timeouts, so a locked table or a slow statement costs
seconds: the step is abandoned with a warning and tried again at the next round.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from django.db import DatabaseError, OperationalError, connections, transaction

from . import conf, cron, history, pruning

logger = logging.getLogger("axa_django")

# Rows deleted per statement (each its own transaction): a short lock on each, and a
# stop is seen between two of them.
RETENTION_BATCH = 2000
# Bounds of one housekeeping statement, in seconds: waiting for a lock, and running.
LOCK_TIMEOUT = 1.0
STATEMENT_TIMEOUT = 5.0

T = TypeVar("T")


class Housekeeper(Protocol):
    """What ``run`` needs of a worker."""

    queues: list[str] | None
    using: str

    def handler_names(self) -> list[str]: ...


@contextlib.contextmanager
def bounded(using: str) -> Iterator[None]:
    """A transaction on ``using`` whose statements give up after the housekeeping timeouts."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # SET LOCAL (is_local=true): ends with the transaction, so nothing stays on a
        # pooled server connection.
        # No JIT either: compiling costs more than any of these statements runs.
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
            "set_config('jit', 'off', true)",
            [f"{round(LOCK_TIMEOUT * 1000)}ms", f"{round(STATEMENT_TIMEOUT * 1000)}ms"],
        )
        # A user's deferred foreign key to axa_queue is checked at each statement, not at
        # the commit: a step refused for one row's sake fails in its savepoint, where it
        # can be isolated (pruning.py), not at a commit that loses the whole step.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        yield


def _schedule(worker: Housekeeper, names: list[str]) -> datetime.datetime:
    """Enqueue due periodic jobs, one savepoint per job; return the database time used."""
    using = conf.get("DATABASE")  # where cron.schedule writes
    with bounded(using):
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT now()")
            now: datetime.datetime = cron.aware(cursor.fetchone()[0])
        for job in cron.scheduled_jobs(names, worker.queues):
            try:
                written = cron.schedule(now, names=[job.name])
            except OperationalError:
                raise  # a timeout or a lost connection: give up the whole step
            except Exception:  # one broken schedule must not hold back the others
                logger.exception("housekeeping failed to schedule periodic job %s; retrying later", job.name)
                continue
            for enqueued in written:
                logger.info("enqueued periodic job %s %s for %s", enqueued.name, enqueued.id, enqueued.unique_key)
    return now


def _rotate(worker: Housekeeper, retention: float) -> None:
    # Three transactions: making the next table is slow and holds nothing the finishes
    # need; the close holds them only for two renames.
    kept = datetime.timedelta(seconds=retention)
    with bounded(worker.using), connections[worker.using].cursor() as cursor:
        history.prepare(cursor)
    with bounded(worker.using), connections[worker.using].cursor() as cursor:
        closed = history.close(cursor, kept / 4)
    with bounded(worker.using), connections[worker.using].cursor() as cursor:
        dropped = history.drop(cursor, kept)
    if closed is not None:
        logger.info("closed history table axa_history_%d", closed)
    if dropped is not None:
        logger.info("dropped history table axa_history_%d, older than RETENTION", dropped)


def _prune(worker: Housekeeper, retention: float, until: threading.Event | None) -> None:
    # Only rows finished in axa_queue itself: the history goes by whole tables (_rotate).
    deleted = 0
    try:
        while True:
            with bounded(worker.using):
                batch = pruning.prune_batch(
                    datetime.timedelta(seconds=retention),
                    batch_size=RETENTION_BATCH,
                    using=worker.using,
                    history=False,
                )
            deleted += batch
            # One batch a round for a burst worker's dispatcher; else until caught up or stopped.
            if until is None or until.is_set() or batch < RETENTION_BATCH:
                break
    finally:
        if deleted:
            logger.info("pruned %d finished job(s) older than RETENTION", deleted)


def _step(what: str, using: str | None, step: Callable[[], T]) -> T | None:
    """Run one housekeeping step; log its failure and return None instead of raising."""
    try:
        return step()
    except DatabaseError as error:
        # A timeout, a lock held elsewhere or a lost connection: the next
        # housekeeping tries again (on a new connection if this one broke).
        logger.warning("housekeeping failed to %s (%s); retrying later", what, str(error).strip())
        # Inside a caller's atomic() block this would close the caller's connection.
        if using is not None and not connections[using].in_atomic_block:
            connections[using].close_if_unusable_or_obsolete()
    except Exception:  # scheduling and pruning must never stop the worker
        logger.exception("housekeeping failed to %s; retrying later", what)
    return None


def run(worker: Housekeeper, prune_until: threading.Event | None = None) -> float | None:
    """Enqueue due periodic jobs this worker could run, then prune if RETENTION is set.

    Without ``prune_until``, one batch; with it, batch after batch until one comes back
    short or the event is set. Return the seconds until the next occurrence of those
    periodic jobs, or None if there are none, so the caller can come back in time for it.
    """
    retention = conf.get("RETENTION")
    names = worker.handler_names()
    jobs = cron.scheduled_jobs(names, worker.queues)
    now = None
    if jobs:
        now = _step("schedule periodic jobs", conf.get("DATABASE"), lambda: _schedule(worker, names))
    if retention is not None:
        _step("rotate the history", worker.using, lambda: _rotate(worker, retention))
        _step("prune", worker.using, lambda: _prune(worker, retention, prune_until))
    # Only when the database could not be read: the host clock, merely to choose
    # when to look again (what is due is always decided by the database clock).
    now = now or datetime.datetime.now(datetime.UTC)
    waits = [
        _step(f"find the next run of {job.name}", None, lambda j=job: cron.seconds_until_next([j], now)) for job in jobs
    ]
    return min((wait for wait in waits if wait is not None), default=None)
