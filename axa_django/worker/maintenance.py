"""The worker's maintenance thread: periodic jobs and retention, on a connection of their own.

On the dispatcher, every claim waited for these steps (a prune batch of 2,000 rows took
20-640 ms on a 10M-row table), and it pruned one batch of RETENTION_BATCH rows a round,
200 rows/s at the default lease: less than a busy queue finishes, so its history
outgrew RETENTION. Here a round prunes until it is caught up. The dispatcher keeps the
rescue and the look for unhandled jobs, each a fraction of a millisecond.
"""

from __future__ import annotations

import threading

from django.db import connections

from .. import housekeeping


class Maintenance:
    """Rounds of ``housekeeping.run`` every ``interval`` seconds (sooner for a due periodic job) until ``stopping``."""

    def __init__(self, worker: housekeeping.Housekeeper, interval: float, stopping: threading.Event) -> None:
        self.worker, self.interval, self.stopping = worker, interval, stopping

    def loop(self) -> None:
        """Run rounds until the worker stops; close this thread's Django connections at the end."""
        try:
            while not self.stopping.is_set():
                soonest = housekeeping.run(self.worker, prune_until=self.stopping)
                wait = self.interval if soonest is None else max(0.01, min(self.interval, soonest))
                self.stopping.wait(wait)
        finally:
            connections.close_all()  # this thread's own: Django's connections are per thread
