"""Housekeeping that has grown slow runs less often: each look takes at most ``SHARE`` of the time.

The rescue's sweep, the never-due check, the reconcile, the look for unhandled jobs and the
look behind the floors read index ranges whole. While a snapshot is held, every row the
queue ran since it was taken leaves a dead entry there that each of them visits: after five
minutes at 1,000 jobs/s they took 0.1-0.2 s a call, growing with the hold, until their
PostgreSQL time doubled the fleet's (benchmarks/results/pg15-soak-held-statements.txt).
A pace keeps each one's cadence while it is cheap and, once it is not, spaces its runs so
that it costs the server at most ``SHARE`` of one core, however long the hold lasts.

A run's time is its wall time on the worker's thread: an upper bound of the server's. In a
process whose job threads keep the GIL busy a cheap look reads as slower than it is and is
spaced out further (2 CPU-bound threads: a 3 ms sweep took 70-80 ms), never past LONGEST.
"""

from __future__ import annotations

import time

# The most of one core's time a paced look may take: a look of 1 s runs every 400 s.
SHARE = 1 / 400
# The longest a paced look waits, however long the last took: its time may have been a
# lock waited on, not work, and what it does (a gone worker's rows, a lost outcome) must
# still happen. Past 1.5 s a look, a hold longer than hours, SHARE no longer holds.
LONGEST = 600.0


class Pace:
    """When a paced look is due: every ``every`` seconds, or ``elapsed / SHARE`` (at most LONGEST) after a slow one."""

    def __init__(self, every: float, first: float | None = None, slack: float = 0.0) -> None:
        # ``slack``: due that much early. A look run after each heartbeat is asked a beat's
        # length after its last start, give or take the beat's own time: without slack, a
        # beat quicker than the one before skipped it for a whole interval (review).
        self.every, self.slack = every, slack
        self.next = time.monotonic() if first is None else first
        self.last = 0.0  # seconds the last run took

    def due(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) + self.slack >= self.next

    def gap(self) -> float:
        """Seconds from one run's start to the next's, as the last run's length sets it."""
        return max(self.every, min(self.last / SHARE, LONGEST))

    def ran(self, started: float, elapsed: float) -> None:
        """A run began at ``started`` (monotonic) and took ``elapsed`` seconds."""
        self.last = elapsed
        self.next = started + self.gap()
