"""The claimer: takes rows for this worker (limited jobs, fleet-limited queues, then the plain claim)."""

from __future__ import annotations

import datetime
import logging
import operator
import time
import uuid
from typing import Any

import psycopg

from .. import registry, sql
from ..context import JobContext
from ..execution import Claimed
from .connection import DispatcherConnection
from .lanes import Lanes
from .ledger import Ledger
from .limited import LimitedClaims
from .options import Options
from .queuelimits import QueueClaim
from .quiet import Quiet
from .watchdog import Watchdog

logger = logging.getLogger("axa_django")

# The longest a NEXT_RUN answer is kept while nothing is announced (Claimer.next_run).
DUE_KEPT = 60.0
_PRIORITY, _RUN_AT = operator.itemgetter(7), operator.itemgetter(8)  # of a claimed row (sql.CLAIM_RETURNING)


class Claimer:
    """Claims on the dispatcher's connection; owns the statements composed for this worker's names."""

    def __init__(
        self,
        options: Options,
        worker_id: uuid.UUID,
        db: DispatcherConnection,
        ledger: Ledger,
        lanes: Lanes,
        quiet: Quiet,
        limited: LimitedClaims,
        watchdog: Watchdog,
    ) -> None:
        self.options, self.worker_id, self.db, self.ledger = options, worker_id, db, ledger
        self.lanes, self.quiet, self.limited, self.watchdog = lanes, quiet, limited, watchdog
        self._statements: dict[tuple[str, tuple[str, ...]], str] = {}
        self._queue_claims: dict[tuple[str, ...], QueueClaim] = {}  # by the names it claims
        self._lane_statements: dict[tuple[tuple[str, ...], tuple[int, ...]], str] = {}
        # Rows the last claim gave back at once (``_give_back``).
        self.given_back: list[uuid.UUID] = []
        # Ids of the rows the claim being built took within their queues' fleet-wide limits.
        self._in_limited_queues: set[uuid.UUID] = set()
        # The last NEXT_RUN: ((names, Quiet.news then), when asked, when its row falls due), monotonic.
        self._due: tuple[tuple[tuple[str, ...], int], float, float | None] | None = None
        self._opened = db.opened  # the dispatcher's connections the lanes were learnt on

    def claim(self, names: list[str], limit: int, ahead: bool = False) -> list[Claimed] | None:
        """Claim and hold up to ``limit`` rows; ``ahead``: more than there are free threads, started_at left for later.

        None if the database failed (logged, backed off). The jobs are held by the
        ledger and timed by the watchdog; the caller hands them out.
        """
        self.given_back = []
        if not names and not self.options.backends:
            return []
        self.ledger.claim_begins()
        self._in_limited_queues = set()
        rows: list[tuple[Any, ...]] | None = []
        try:
            rows = self._rows(names, limit, ahead)
        finally:
            stale = self.ledger.claim_ends([row[0] for row in rows or ()])
        if rows is None:
            return None
        if stale:
            rows = [row for row in rows if row[0] not in stale]
            self._give_back(stale)
        # The claims' own order, priority first, then run_at: threads take the best first.
        rows.sort(key=_RUN_AT)
        rows.sort(key=_PRIORITY, reverse=True)  # stable, reversed too: equal priorities keep run_at's order
        return self._build(rows)

    def _rows(self, names: list[str], limit: int, ahead: bool) -> list[tuple[Any, ...]] | None:
        """Claim up to ``limit`` rows: limited jobs, then queues with a fleet-wide limit, then the rest."""
        options = self.options
        # Jobs with a concurrency or rate limit first (limited.py), then the others as ever.
        free = max(0, options.concurrency - self.ledger.running())
        rows = self.limited.claim(names, limit, free, ahead)
        limited = self.limited.limited_names(names)
        fast = [name for name in names if name not in limited]
        quiet = self.quiet
        if len(rows) < min(limit, free) and (fast or options.backends) and quiet.due("queues"):
            stirs = quiet.stirs
            taken = self._claim_queues(fast, min(limit, free) - len(rows))
            if taken:
                self._in_limited_queues = {row[0] for row in taken}
            if taken is not None:
                # Not tried (no queue of ours has a limit) is not empty: noted as empty, it made
                # each empty claim of an idle worker two, the second to try the kind it skipped.
                rows += quiet.note("queues", taken, stirs)
        if len(rows) < limit and (fast or options.backends) and quiet.due("plain"):
            stirs = quiet.stirs
            more = self._claim_plain(fast, limit - len(rows), ahead)
            if more is None and not rows:
                return None
            rows += quiet.note("plain", more or [], stirs) if limited else more or []
        return rows

    def _give_back(self, stale: set[uuid.UUID]) -> None:
        """Give back rows claimed again while this worker still has an earlier attempt of them, unstarted.

        Rescued during an outage past the lease, then claimed here before that attempt's
        outcome was written: run, the job ran twice at once (the stale outcome queued the
        row again mid-run). Its earlier attempt's outcome then finds the row changed and
        is not written; the job runs again later, once (``given_back``: the dispatcher
        waits a little for that attempt to be done with).
        """
        self.given_back = list(stale)
        logger.warning(
            "claimed %d job(s) again that this worker still has an earlier attempt of (rescued during an outage): "
            "given back to the queue, unstarted: %s",
            len(stale),
            ", ".join(map(str, sorted(stale))),
        )
        self.db.execute(sql.UNCLAIM, {"ids": self.given_back, "worker": self.worker_id})

    def _build(self, rows: list[tuple[Any, ...]]) -> list[Claimed]:
        """Claimed jobs of ``rows``, held by the ledger and timed by the watchdog."""
        # The dispatcher's thread builds every claimed job, and in a drain of short jobs it
        # is the one the job threads wait on: what can be, is looked up once per name.
        kinds: dict[str, tuple[Any, bool, bool]] = {}
        jobs, timed_jobs = [], []
        in_limited_queues, self._in_limited_queues = self._in_limited_queues, set()
        for job_id, name, args, attempt, max_attempts, backend, unmarked, *rest in rows:
            job = Claimed(job_id, name, None, attempt, max_attempts, backend, args_json=args, unmarked=unmarked)
            if in_limited_queues and job_id in in_limited_queues:
                job.limited_queue = True
            kind = kinds.get(name)
            if kind is None:
                function = registry.get(name)
                timed = function is not None and bool(function.options.timeout)
                kind = kinds[name] = (
                    function,
                    timed,
                    function is not None and (function.takes_context or function.is_async),
                )
            function, timed, needs_context = kind
            # A task row may be async; its context lets a cancel reach it.
            if backend is not None or needs_context:
                job.context = JobContext(job_id, name, attempt, self.worker_id)
            if timed or rest[3] is not None or backend is not None:
                timed_jobs.append((job, function, rest[3], rest[4]))
            jobs.append(job)
        self.ledger.hold(jobs)
        for job, function, timeout, claimed_at in timed_jobs:  # held first: the watchdog finds them there
            # The claim's time, read as seconds (sql.CLAIM_RETURNING).
            if claimed_at is not None:
                claimed_at = datetime.datetime.fromtimestamp(claimed_at, datetime.UTC)
            self.watchdog.watch(job, function=function, timeout=timeout, claimed_at=claimed_at)
        return jobs

    def _claim_plain(self, names: list[str], limit: int, ahead: bool) -> list[tuple[Any, ...]] | None:
        """Claim up to ``limit`` rows of jobs without limits, each lane walked from its floor (worker/lanes.py)."""
        params: dict[str, Any] = {"worker": self.worker_id, "limit": limit, "ahead": ahead}
        lanes = self.lanes
        lanes.serve(names)
        bounded = lanes.bounded()
        if bounded:
            key = lanes.key()
            statement = self._lane_statements.get((tuple(names), key))
            if statement is None:
                options = self.options
                statement = sql.compose(sql.CLAIM_LANES, names, options.backends, options.queues, lanes=key)
                self._lane_statements[(tuple(names), key)] = statement
            params["floors"] = lanes.floors(key)
        else:
            statement = self.composed(sql.CLAIM_FULL, names)
        rows = self.db.execute(statement, params, binary=True, prepare=True)
        if rows is None:
            lanes.forget()
            return None
        claimed = [row[:12] for row in rows if row[0] is not None]
        snap = next((row[12:] for row in rows if row[0] is None), None)
        if self.db.opened != self._opened:
            # This claim ran on a new connection: what the lanes learnt came from the server
            # before it, and this claim may have walked from those floors. The next walks in full.
            self._opened = self.db.opened
            lanes.reset()
        elif snap is not None:
            lanes.learn(claimed, snap, full=not bounded, exhausted=len(claimed) < limit)
        return claimed

    def _claim_queues(self, names: list[str], limit: int) -> list[tuple[Any, ...]] | None:
        """Claim up to ``limit`` rows of queues with a fleet-wide limit (worker/queuelimits.py), for free threads.

        None if not tried: no queue this worker serves has a limit.
        """
        conn = self.db.current()
        if conn is None:
            return []
        key = tuple(names)
        if key not in self._queue_claims:
            options = self.options
            self._queue_claims[key] = QueueClaim(self.worker_id, names, options.backends, options.queues)
        try:
            quiet = self.quiet
            return self._queue_claims[key].claim(conn, limit, quiet.news if quiet.heard_all else None)
        except psycopg.Error as error:
            self.db.failed("jobs of limited queues", error)
            return []

    def composed(self, template: str, names: list[str]) -> str:
        """``template`` with this worker's names, backends and queues written in, composed once."""
        # Names, backends and queues do not change while the worker runs; sent as
        # parameters, psycopg adapted the same arrays on every claim (measured:
        # 5,200 -> 8,000 no-op jobs/s per process), so they are written in once.
        key = (template, tuple(names))
        if key not in self._statements:
            self._statements[key] = sql.compose(template, names, self.options.backends, self.options.queues)
        return self._statements[key]

    def next_run(self, names: list[str]) -> float:
        """Seconds until the next of this worker's rows falls due (the idle wait at most: ``Quiet.idle_wait``).

        Asked of the database again only when something was announced since (a NOTIFY, a
        retry written: ``Quiet.news``), when the row it found falls due, or after
        DUE_KEPT; not at every idle poll, where it was one of an idle worker's three
        statements a second. A row made due sooner without a word (another worker's
        retry) is claimed by the poll's claim, as it would be without this look.
        """
        poll = self.quiet.idle_wait(self.options.poll_interval, self.options.housekeeping_interval)
        if not names and not self.options.backends:
            return poll
        quiet, now = self.quiet, time.monotonic()
        key = (tuple(names), quiet.news)  # read before the statement: news after it asks again
        kept = self._due
        if (
            kept is not None
            and quiet.heard_all
            and kept[0] == key
            and now - kept[1] < DUE_KEPT
            and (kept[2] is None or kept[2] > now)
        ):
            return quiet.token_wait(poll if kept[2] is None else kept[2] - now)
        self._due = None
        rows = self.db.execute(self.composed(sql.NEXT_RUN, names), {})
        if rows is None:
            return quiet.token_wait(poll)
        seconds = None if not rows or rows[0][0] is None else float(rows[0][0])
        self._due = (key, now, None if seconds is None else now + seconds)
        return quiet.token_wait(poll if seconds is None else seconds)
