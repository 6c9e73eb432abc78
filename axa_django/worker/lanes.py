"""Where the plain claim resumes its walk in each lane, so that it never walks the entries of rows it has claimed.

A claim leaves an index entry behind for each row it takes (the row's queued version
is dead). VACUUM cannot remove such entries while any transaction holds an older
snapshot (a ``pg_dump``, a long report, a replica with ``hot_standby_feedback``), and
btree scans cannot mark them dead either: a claim that walks from the start of the
index walks every one of them, and in an hour of load that is millions.

So the claim walks each lane, a priority, from a floor: the ``run_at`` of the newest
row it claimed there, held below the ``run_at`` of any row that may still
appear behind it. A row appears behind the floor when its transaction commits after
newer rows were claimed: its ``run_at`` is its INSERT's statement time. Each claim
returns its snapshot's oldest running transaction id (``xmin``), an id above every id
given before it began (``xmax``: its own, or the next to be given) and its time; a
transaction running at a claim got its id after the last earlier claim whose ``xmax``
is at most that ``xmin``, so its rows' ``run_at`` is at least that claim's time (less
``MARGIN``, for a statement that began before it wrote).
A read-only transaction holding a snapshot has no id: it never holds the floor back.

Rows made ready with an older ``run_at`` (a workflow's child when its last parent
ends, a resumed queue, rows given back unstarted) announce it: ``lower()`` takes the
floor down to their time. Lanes not seen yet are walked in full (the priorities
between known lanes). Anything else behind a floor (a row written by hand, the seed's
REQUEUE_STALE, a row another worker's claim gave back by rolling back) is found by the
look behind the floors (worker/lookout.py), every ``FULL_SCAN`` seconds on another
connection, which lowers the floor to it: a walk through a held snapshot's dead entries
that never holds up a claim. While no look has come in for ``2 * FULL_SCAN`` seconds
(or more, at a long heartbeat interval), one claim in ``FULL_SCAN`` walks every lane from
the start instead; every ``FULL_SCAN_UNNOTIFIED`` seconds where no notification can
reach the worker. The floors hold for the names the claims were made for: claims for
other names (a name whose limit was lifted joins the plain claim) walk in full first.
"""

from __future__ import annotations

import bisect
import datetime
import queue
import time
from collections.abc import Sequence
from typing import Any

from ..sql import segments

# Seconds a statement may run before its first write gives its transaction an id.
MARGIN = datetime.timedelta(milliseconds=50)
# How far behind a claim's time that walked every segment to its end the floors stop: rows
# of other names newer than this are read again by each claim, and a statement that wrote
# its first row later than this after it began waits for the look.
SWEPT_LAG = datetime.timedelta(seconds=1)
# Seconds between claims that walk every lane from its start. Such a walk reads every
# dead entry a held snapshot keeps (0.1 s and more after minutes of load), so it is rare
# while notifications announce the rows that become ready behind the floors; without
# them (NOTIFY off, a transaction pooler) it is what finds those rows.
FULL_SCAN = 30.0
FULL_SCAN_UNNOTIFIED = 2.0
# Transaction ids and times of past claims kept to place the floor (a ring, oldest first).
HISTORY = 4096
# Lanes given a floor; priorities past them are walked from their start (a project that
# spreads its priorities wide keeps a claim statement of bounded size).
MAX_LANES = 32


class Lanes:
    """The plain claim's floors for one worker's dispatcher (one thread: no locking)."""

    def __init__(self, *, notified: bool = True) -> None:
        self.full_scan = FULL_SCAN if notified else FULL_SCAN_UNNOTIFIED
        self.fronts: dict[int, datetime.datetime] = {}  # by priority
        self._served: tuple[str, ...] | None = None
        # The time of the last claim that walked every segment to its end (it took fewer
        # rows than it asked for): each segment is walked from there at least, so that
        # ready rows of names this worker does not serve are read once, not at every claim.
        self._swept: datetime.datetime | None = None
        # Times handed over by other threads (the listener, the look): applied by the dispatcher.
        # A pair: a look's start and the time it covers the floors until (monotonic seconds).
        self._lowered: queue.SimpleQueue[datetime.datetime | tuple[float, float] | None] = queue.SimpleQueue()
        self._xmax: list[int] = []
        self._at: list[datetime.datetime] = []
        self._cap: datetime.datetime | None = None  # no row can appear behind this
        self._next_full = 0.0
        self._looked_until = 0.0  # a look covered the lanes' floors until this (monotonic)
        self._forced_at = 0.0  # when a walk in full was last asked for (monotonic)
        # For the look on another thread: the names the floors hold for, the lanes, and the
        # floor of each segment of their walk (None: from its start). Replaced whole, never changed.
        self.shown: tuple[tuple[str, ...], tuple[int, ...], tuple[datetime.datetime | None, ...]] = ((), (), ())

    def serve(self, names: Sequence[str]) -> None:
        """Claim for ``names`` from now on: floors learnt for other names start again from nothing."""
        served = tuple(names)
        if served != self._served:
            if self._served is not None:
                self.fronts.clear()
                self._swept = None
                self.shown = ((), (), ())
            self._served = served

    def bounded(self) -> bool:
        """Whether the next claim may walk from floors (else it walks every lane in full)."""
        while not self._lowered.empty():
            when = self._lowered.get_nowait()
            if when is None:
                self._next_full = self._looked_until = 0.0
                self._forced_at = time.monotonic()
                self._swept = None
                continue
            if isinstance(when, tuple):
                # A look covered the floors it was shown, as of its start; not a full
                # walk asked for after that start.
                started, until = when
                if started > self._forced_at:
                    self._looked_until = until
                continue
            for lane, front in self.fronts.items():
                if front > when:
                    self.fronts[lane] = when
            if self._swept is not None and self._swept > when:
                self._swept = when
        now = time.monotonic()
        known = bool(self.fronts) or self._swept is not None
        return self._cap is not None and known and (now < self._next_full or now < self._looked_until)

    def key(self) -> tuple[int, ...]:
        """The known lanes' priorities, highest first: compose them and ``floors()`` alike."""
        return tuple(sorted(self.fronts, reverse=True))

    def _segment_floors(self, key: Sequence[int], cap: datetime.datetime) -> tuple[datetime.datetime | None, ...]:
        """The floor of each segment of the walk over ``key``'s lanes (sql.segments); None: from its start."""
        swept = self._swept
        found: list[datetime.datetime | None] = []
        for lane, _, _ in segments(key):
            if lane is None:
                found.append(None if swept is None else min(swept, cap))
            else:
                front = self.fronts[lane]
                found.append(min(front if swept is None else max(front, swept), cap))
        return tuple(found)

    def floors(self, key: Sequence[int]) -> str:
        """The floor of each segment of the walk over ``key``'s lanes, as a PostgreSQL array literal of timestamptz."""
        cap = self._cap
        assert cap is not None
        return literal(self._segment_floors(key, cap))

    def learn(
        self,
        rows: Sequence[Sequence[Any]],
        snap: Sequence[Any],
        *,
        full: bool,
        exhausted: bool = False,
    ) -> None:
        """Record a claim: the rows it took (priority at 7, run_at at 8, in UTC without a
        zone) and its snapshot (oldest running transaction id, an id above every id given
        before it began, time); ``exhausted``: it took fewer rows than it asked for, so it
        walked every segment to its end."""
        xmin, xmax, at = snap
        # A run_at equal to the claim's own time is not where the walk stood: the claim
        # moved the row up from before year 1 (sql.RUN_AT). Taken as a front, it put
        # every row still queued in that lane behind the floor.
        moved_up = at.astimezone(datetime.UTC).replace(tzinfo=None)
        newest: dict[int, datetime.datetime] = {}
        for row in rows:
            lane, run_at = row[7], row[8]
            if run_at != moved_up and (lane not in newest or newest[lane] < run_at):
                newest[lane] = run_at
        fronts = self.fronts
        for lane, run_at in newest.items():
            if lane not in fronts and len(fronts) >= MAX_LANES:
                continue
            front = run_at.replace(tzinfo=datetime.UTC)
            if lane not in fronts or fronts[lane] < front:
                fronts[lane] = front
        if full:
            self._next_full = time.monotonic() + self.full_scan
        self._xmax.append(xmax)
        self._at.append(at)
        # The oldest running id only grows, and so do the claims' ids above: the latest
        # claim whose id is at most this one's oldest running id stays found.
        found = bisect.bisect_right(self._xmax, xmin) - 1
        if found < 0:
            # A transaction older than every claim kept is still running: walk in full
            # until it ends (it may yet write rows with its old statement times).
            self._cap = None
            if len(self._xmax) > HISTORY:
                del self._xmax[0], self._at[0]
            return
        # A claim that took fewer rows than it asked for does not move the fronts past the
        # rows it took: the sweep below moves every floor, and only as far as the cap.
        self._cap = cap = self._at[found] - MARGIN
        del self._xmax[:found], self._at[:found]
        if exhausted:
            # Rows of this worker's names it passed over are held by other claims (SKIP
            # LOCKED: theirs once they commit), or by a writer whose lock ends later: the
            # look finds those behind the floors. No further than this claim's own cap: a
            # transaction running at it (a bulk INSERT) commits its rows, whose run_at is
            # its statement's start, later (swept past them, 100,000 rows waited 8 s for the
            # look). SWEPT_LAG: an INSERT ... SELECT whose first write comes late after its
            # statement began, before it has a transaction id, is not left behind either.
            self._swept = min(at - SWEPT_LAG, cap)
        key = self.key()
        self.shown = (self._served or (), key, self._segment_floors(key, cap))

    def lower(self, when: datetime.datetime | None) -> None:
        """Rows with ``run_at`` from ``when`` on became ready (None: any time): walk from there (any thread)."""
        self._lowered.put(when)

    def looked(self, when: datetime.datetime | None, started: float, valid: float) -> None:
        """A look behind the floors that began at ``started`` (monotonic) ended (any thread).

        ``when``: the oldest ready row it found behind a floor (the floors go down to it),
        or None. Either way the claims may walk from their floors for ``valid`` seconds
        more without walking in full, unless a full walk was asked for since ``started``.
        """
        if when is not None:
            self._lowered.put(when)
        self._lowered.put((started, time.monotonic() + valid))

    def heard(self, payload: str) -> None:
        """Apply a notification's payload: ``ready:<epoch>`` (rows from then on) or ``rescan`` (any thread)."""
        if payload == "rescan":
            self.lower(None)
        elif payload.startswith("ready:"):
            try:
                # A float holds microseconds only just: a millisecond's slack keeps the row ahead of the floor.
                when = datetime.datetime.fromtimestamp(float(payload[6:]) - 0.001, tz=datetime.UTC)
            except (ValueError, OverflowError, OSError):  # '-Infinity', a year before 1: from the start
                self.lower(None)
                return
            self.lower(when)

    def forget(self) -> None:
        """Walk every lane in full at the next claim (a new connection, an error)."""
        self._next_full = self._looked_until = 0.0
        self._forced_at = time.monotonic()

    def reset(self) -> None:
        """Start again from nothing: the claims now reach a server that may not hold what the floors
        were learnt on (a crash lost the newest rows, a failover promoted a standby that lagged; rows
        the reconcile and the rescue queued again are behind every front, and their notifications
        may have gone before the listener was back)."""
        self.fronts.clear()
        self._swept = None
        self._xmax.clear()
        self._at.clear()
        self._cap = None
        self.shown = ((), (), ())
        self.forget()


def literal(floors: Sequence[datetime.datetime | None]) -> str:
    """Floors as a PostgreSQL array literal of timestamptz, '-infinity' for None (from the start)."""
    return "{" + ",".join("-infinity" if floor is None else f'"{floor.isoformat()}"' for floor in floors) + "}"
