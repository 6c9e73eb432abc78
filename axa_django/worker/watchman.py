"""The watchman: the rescue of dead workers' rows (and its kin) and the look for unhandled jobs.

Both read indexes whose dead entries a held snapshot keeps (the rescue the running rows',
the look for unhandled jobs the queued rows'): after minutes of a held snapshot at 1,000
jobs/s they took 0.1 s every ``LEASE_SECONDS / 3`` and 0.5-0.9 s every minute, on the
dispatcher, which claimed nothing meanwhile (the held soak's p99). A worker runs them on
its heartbeat's thread and connection, after a beat; a ``--burst`` worker, which may be
gone before its first beat, runs them on the dispatcher between claims.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from .. import conf, dependencies, sql, unhandled
from .options import Options

logger = logging.getLogger("axa_django")

# Runs one statement under housekeeping timeouts; its rows, or None if it failed (logged).
Run = Callable[[str, dict[str, Any]], list[tuple[Any, ...]] | None]


class Watchman:
    """What is due of the rescue (every ``LEASE_SECONDS / 3``) and the look for unhandled jobs (every minute)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._next_rescue = 0.0
        # The first look waits a lease: workers started together have all registered by then.
        self._next_unhandled = time.monotonic() + options.lease

    def rescue(self, run: Run) -> None:
        """Queue again the rows of workers whose lease ran out (and fail rows that can never run)."""
        options = self.options
        params = {"lease": options.lease, "stale": options.stale_minutes, "max_losses": int(conf.get("MAX_LOSSES"))}
        rows = run(sql.RESCUE, params)
        if rows:
            failed = sum(1 for _, status in rows if status == "failed")
            logger.warning(
                "requeued %d job(s) whose worker stopped%s",
                len(rows) - failed,
                f"; {failed} more had lost their worker max_losses times and failed" if failed else "",
            )
        rows = run(sql.FAIL_NEVER_DUE, {})
        if rows:
            logger.warning("failed %d job(s) whose run_at was 'infinity' or after year 9999", len(rows))
        run(dependencies.SWEEP, {})  # children of parents ended outside a finisher

    def watch(self, run: Run) -> None:
        """Run what is due."""
        now = time.monotonic()
        if now >= self._next_rescue:
            self._next_rescue = now + self.options.housekeeping_interval
            self.rescue(run)
        if now >= self._next_unhandled:
            self._next_unhandled = now + unhandled.CHECK_SECONDS
            rows = run(sql.UNHANDLED, unhandled.params(self.options.lease))
            unhandled.warn(unhandled.rows_to_unhandled(rows or []))
