"""The watchman: the rescue of dead workers' rows (and its kin) and the look for unhandled jobs.

Both read indexes whose dead entries a held snapshot keeps (the rescue the running rows',
the look for unhandled jobs the queued rows'): after minutes of a held snapshot at 1,000
jobs/s they took 0.1 s every ``LEASE_SECONDS / 3`` and 0.5-0.9 s every minute, on the
dispatcher, which claimed nothing meanwhile (the held soak's p99). A worker runs them on
its heartbeat's thread and connection, after a beat; a ``--burst`` worker, which may be
gone before its first beat, runs them on the dispatcher between claims. Those that walk an
index range whole are paced (pacing.py): a held snapshot spaces them out instead of letting
their cost grow with the hold; the rescue of workers whose lease ran out never waits.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import conf, dependencies, sql, unhandled
from ..sql import refused
from .connection import opened
from .ledger import Ledger
from .options import Options
from .pacing import Pace

logger = logging.getLogger("axa_django")

# Runs one statement under housekeeping timeouts; its rows, or None if it failed (logged).
# Keywords: in_place (rows it finishes stay in axa_queue), refusable (a refusal for a
# row's sake raises refused.Refused instead of returning None).
Run = Callable[..., list[tuple[Any, ...]] | None]


# The reconcile's cadence when nothing happened, its grace for claims not yet in the
# ledger (at least the housekeeping interval), and the rounds it runs after a reconnect.
RECONCILE_SECONDS = 60.0
RECONCILE_GRACE = 2.0
RECONCILE_ROUNDS = 3
# While another worker polls for the fleet (worker/quiet.py), this one rescues every this
# many housekeeping intervals, not every one: the poller rescues for everyone, and each
# rescue is three statements a worker; the others' rescue is there should the poller's fail.
RESCUE_FOLLOWING = 6
# Refused rows remembered, at most (then the oldest are tried again).
REFUSED_KEPT = 10_000


class _Cut(Exception):
    """A statement of the row-by-row rescue did not run (timeout, lost connection): the rest waits a round."""


class Watchman:
    """What is due of the rescue (every ``LEASE_SECONDS / 3``) and the look for unhandled jobs (every minute)."""

    def __init__(self, options: Options, worker_id: uuid.UUID | None = None, ledger: Ledger | None = None) -> None:
        self.options, self.worker_id, self.ledger = options, worker_id, ledger
        self._last_rescue = -float("inf")
        # The rescue's sweep (RESCUE: rows of gone workers, stale seed rows) and the never-due
        # check run at every rescue while they are cheap; sql.RESCUE_DEAD at the others.
        slack = options.housekeeping_interval / 2
        self._sweep = Pace(options.housekeeping_interval, slack=slack)
        self._never_due = Pace(options.housekeeping_interval, slack=slack)
        # The first look waits a lease: workers started together have all registered by then.
        self._unhandled = Pace(unhandled.CHECK_SECONDS, first=time.monotonic() + options.lease)
        self._next_reconcile = time.monotonic() + RECONCILE_SECONDS
        self._reconcile_pace = Pace(RECONCILE_SECONDS)  # its gap: the minute, or more after a slow round
        self._opened = opened()  # connections opened when last reconciled
        self._reconcile_rounds = 0  # reconciles still due after a reconnect
        # Rows the database refused to write even in place: passed over, each said once.
        self._refused: dict[Any, str] = {}

    def reconcile(self, run: Run) -> None:
        """Queue again the rows running under this worker that it no longer holds (a crash, a failover).

        After any new connection (it may reach a server that lost what this worker wrote,
        or a promoted standby), at the next rounds until the claims made before it are
        older than the grace; and once a minute whatever happens.
        """
        if self.worker_id is None or self.ledger is None:
            return
        now = time.monotonic()
        if opened() != self._opened:
            self._opened = opened()
            self._reconcile_rounds = RECONCILE_ROUNDS
        if self._reconcile_rounds <= 0 and now < self._next_reconcile:
            return
        grace = max(RECONCILE_GRACE, self.options.housekeeping_interval)
        params = {"worker": self.worker_id, "held": self.ledger.owned(), "grace": grace}
        # Counted as run even when cut short: under a held snapshot its walk grows with every
        # job this worker ran, and retried at every beat it would eat the rescue's time. For
        # that walk, the minute's round is paced (pacing.py); the rounds after a reconnect are not.
        self._reconcile_rounds -= 1
        self._next_reconcile = now + RECONCILE_SECONDS
        pace = self._reconcile_pace
        rows = self._isolated(
            run, sql.RECONCILE, refused.RECONCILE_IDS, refused.RECONCILE_ONE, params, "reconcile", pace
        )
        self._next_reconcile = now + pace.gap()
        if rows:
            logger.warning(
                "queued %d job(s) again that were running under this worker but no longer held by it: the "
                "database lost what the worker wrote of them (a crash or a failover); they run again",
                len(rows),
            )

    def rescue(self, run: Run) -> None:
        """Queue again the rows of workers whose lease ran out (and fail rows that can never run)."""
        options = self.options
        params = {"lease": options.lease, "stale": options.stale_minutes, "max_losses": int(conf.get("MAX_LOSSES"))}
        sweep = self._sweep.due()
        # A refusal falls back to the sweep's one-row forms: RESCUE's rows include RESCUE_DEAD's.
        statement, pace = (sql.RESCUE, self._sweep) if sweep else (sql.RESCUE_DEAD, None)
        rows = self._isolated(run, statement, refused.RESCUE_LOST, refused.RESCUE_ONE, params, "rescue of job", pace)
        if rows:
            failed = sum(1 for _, status in rows if status == "failed")
            logger.warning(
                "requeued %d job(s) whose worker stopped%s",
                len(rows) - failed,
                f"; {failed} more had lost their worker max_losses times and failed" if failed else "",
            )
        if self._never_due.due():
            rows = self._isolated(
                run,
                sql.FAIL_NEVER_DUE,
                refused.NEVER_DUE_IDS,
                refused.FAIL_NEVER_DUE_ONE,
                {},
                "never-due job",
                self._never_due,
            )
            if rows:
                logger.warning("failed %d job(s) whose run_at was 'infinity' or after year 9999", len(rows))
        # Children of parents ended outside a finisher; a child whose move is refused is cancelled in place.
        try:
            run(dependencies.SWEEP, {}, refusable=True)
        except refused.Refused as error:
            logger.error("settling workflow children was refused (%s); settling them in place, in axa_queue", error)
            run(dependencies.SWEEP, {}, in_place=True)

    def _isolated(
        self,
        run: Run,
        statement: str,
        candidates: str,
        one: str,
        params: dict[str, Any],
        what: str,
        pace: Pace | None = None,
    ) -> list[tuple[Any, ...]] | None:
        """Run ``statement``; if the database refuses it for one row's sake, write its rows one at a time.

        One row a user's foreign key or trigger refuses then fails alone, finished in place
        if it must (sql/refused.py); before, it failed the whole rescue for every dead
        worker's job, at every round. ``pace`` is told how long the statement took (its
        walk), not the rows written one at a time after a refusal: those are progress.
        """
        started = time.monotonic()
        try:
            return run(statement, params, refusable=True)
        except refused.Refused as error:
            logger.error("the %s statement was refused (%s); writing its rows one at a time", what, error)
        finally:
            if pace is not None:
                pace.ran(started, time.monotonic() - started)
        ids = run(candidates, {**params, "skip": list(self._refused)})
        if not ids:
            return None
        rows: list[tuple[Any, ...]] = []

        def write(job_id: Any, why: str | None) -> None:
            extra = {"id": job_id, "refused": None if why is None else refused.note(why)}
            extra["refused_type"] = refused.REFUSED_TYPE
            written = run(one, {**params, **extra}, in_place=why is not None, refusable=True)
            if written is None:
                raise _Cut
            rows.extend(written)

        with contextlib.suppress(_Cut):  # the rest at the next round
            refused.each([row[0] for row in ids], write, lambda e: isinstance(e, refused.Refused), what, self._refused)
        while len(self._refused) > REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        return rows

    def watch(self, run: Run, following: bool = False) -> None:
        """Run what is due: the rescue of dead workers' rows first, then this worker's own reconcile.

        ``following``: another worker polls for the fleet, and rescues at every interval.
        """
        now, interval = time.monotonic(), self.options.housekeeping_interval
        # From the last rescue: a worker that becomes the poller rescues at its next interval.
        # Half an interval early at most: called after each beat, a beat quicker than the one
        # before it found the interval not quite over and skipped a whole one (review).
        if now + interval / 2 >= self._last_rescue + interval * (RESCUE_FOLLOWING if following else 1):
            self._last_rescue = now
            self.rescue(run)
        self.reconcile(run)
        if self._unhandled.due():
            started = time.monotonic()
            unhandled.look(run, worker=self.worker_id, lease=self.options.lease)
            self._unhandled.ran(started, time.monotonic() - started)
