"""The heartbeat: the lease on this worker's jobs, on a thread and connection that no claim waits on.

After a beat, in what is left of the interval, the same thread runs the watchman (the
rescue, the look for unhandled jobs) and the look behind the lanes' floors: statements
that read a held snapshot's dead index entries, kept off the dispatcher.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from .. import sql
from ..ops import health
from ..sql import refused
from .connection import close, connect
from .control import Control
from .ledger import Ledger
from .logs import Summary
from .lookout import Lookout
from .options import Options
from .quiet import Quiet
from .watchman import Watchman

logger = logging.getLogger("axa_django")

# A failed beat is tried again this soon, doubling up to the interval. Waiting a whole
# interval let one slow beat cost the lease: a beat, up to 0.6 interval of housekeeping,
# an interval, a beat failing at its interval-long timeout, an interval: 3.6 intervals,
# and the lease is three, so a live worker was presumed dead and its jobs ran twice.
# Now: a beat, a failed one an interval after it began, the retry 0.1 s later: 2.1.
RETRY_FIRST = 0.1


class Heartbeat:
    """Refreshes the lease every lease/3, touches the health file, relays cancels flagged in rows, then
    runs the watchman's work and the look when due."""

    def __init__(
        self,
        options: Options,
        worker_id: uuid.UUID,
        control: Control,
        ledger: Ledger,
        lookout: Lookout | None = None,
        watchman: Watchman | None = None,
        quiet: Quiet | None = None,
        on_stop_request: Callable[[], None] | None = None,
    ) -> None:
        self.options, self.worker_id, self.control, self.ledger = options, worker_id, control, ledger
        # What a stop asked from the admin does: this worker's stop, or its process's (per-queue pools).
        self.on_stop_request = on_stop_request or control.stop
        self.stop_requested_by: str | None = None
        # After a beat, when due: the look behind the lanes' floors, the rescue, the look for unhandled jobs.
        self.lookout, self.watchman = lookout, watchman
        # Where the beat says whether this worker polls for the fleet; none: it takes no part
        # (no notifications reach it, or it is a --burst worker, gone soon).
        self.quiet = quiet if options.notify and not options.burst else None
        self.summary = Summary(worker_id)

    def touch_health_file(self) -> None:
        """Touch the health file, if the worker has one (an error is logged: jobs still run)."""
        try:
            health.touch(self.options.health_file)
        except OSError as error:
            logger.warning("cannot touch the health file %s (%s); jobs still run", self.options.health_file, error)

    def loop(self) -> None:
        """Beat until the worker is done."""
        conn: psycopg.Connection[Any] | None = None
        interval = self.options.housekeeping_interval
        timeout = f"{max(100, round(interval * 1000))}ms"
        self.touch_health_file()  # the worker has just registered
        due, retry = time.monotonic() + interval, RETRY_FIRST
        with contextlib.suppress(psycopg.Error):
            # Now, not at the first beat: a connection slow to open (a loaded server) came on
            # top of the first interval, and the lease started at the registration.
            conn = connect(self.options.using, "heartbeat")
        while not self.control.done.wait(max(0.0, due - time.monotonic())):
            began = time.monotonic()
            # Before the beat: said through an outage too, which no beat may come out of.
            self.summary.tick(*self.ledger.tally(), self.ledger.running())
            try:
                if conn is None or conn.closed:
                    self._lost_poll()
                    conn = connect(self.options.using, "heartbeat")
                elect = self.quiet is not None
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.execute(sql.TIMEOUTS, {"statement": timeout, "lock": timeout})
                    params = {"worker": self.worker_id, "ids": self.ledger.ids(), "elect": elect}
                    cursor.execute(sql.HEARTBEAT, params)
                    alive, cancelled, _, stop_by, polls, fleet = cursor.fetchone() or (1, [], None, None, None, 1)
                    self.ledger.fleet = fleet
                    if not alive:
                        self.rejoin(cursor)
                if self.quiet is not None:
                    self.quiet.poller = bool(polls)
            except refused.OUTAGE as error:
                if not isinstance(error, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
                    close(conn)
                    conn = None
                    self._lost_poll()
                due, retry = time.monotonic() + retry, min(retry * 2, interval)
                logger.warning("heartbeat failed (%s); trying again in %.1fs", error, due - time.monotonic())
                continue
            except psycopg.Error as error:
                due, retry = time.monotonic() + retry, min(retry * 2, interval)
                logger.error(
                    "heartbeat failed (%s: %s); trying again in %.1fs",
                    type(error).__name__,
                    error,
                    due - time.monotonic(),
                )
                continue
            # Beats keep their cadence: the next is an interval after this one began, not after
            # the housekeeping below (which made beats up to 1.6 intervals apart, 2.6 after a slow one).
            due, retry = began + interval, RETRY_FIRST
            self.touch_health_file()
            self.ledger.cancel(cancelled)
            if stop_by is not None and self.stop_requested_by is None:
                self.stop_requested(stop_by)
            # What follows has 60% of an interval, so that even after a beat that took its
            # whole timeout the next comes within 1.6 intervals (the lease is three): each
            # statement is cut at what is left, and what did not fit runs after the next beat.
            until = time.monotonic() + max(0.6 * interval, 0.15)
            if self.watchman is not None:
                following = self.quiet is not None and self.quiet.poller is False
                self.watchman.watch(functools.partial(self._run, conn, until), following)
            if self.lookout is not None and self.lookout.due() and (left := _left(until)) is not None:
                try:
                    self.lookout.look(conn, left)
                except psycopg.Error as error:
                    # The claims walk in full meanwhile, as they did before there was a look.
                    logger.warning("the look for ready rows behind the claims' floors failed (%s)", error)
            if conn.closed:  # lost meanwhile: a new connection at the next beat
                close(conn)
                conn = None
                self._lost_poll()
        close(conn)

    def _lost_poll(self) -> None:
        """No beat now: whether this worker is the fleet's poller is unknown until one; poll at POLL_INTERVAL."""
        if self.quiet is not None:
            self.quiet.poller = None

    def stop_requested(self, by: str) -> None:
        """Someone asked this worker to stop from the admin: stop as on SIGTERM (jobs in progress finish)."""
        self.stop_requested_by = by
        logger.info(
            "worker %s: %s asked it to stop from the admin; finishing jobs in progress",
            self.worker_id,
            by or "someone",
        )
        self.on_stop_request()

    def rejoin(self, cursor: psycopg.Cursor[Any]) -> None:
        """Our row is gone (taken for dead, or by our own stop): drop the rows claimed ahead; rejoin unless stopping.

        The rescue queued those rows again for any worker: running them here too ran each
        twice (a restart under three workers: 1,086 jobs). Rows claimed since are given back
        here; if this transaction fails, we stay unregistered and the rescue's next sweep takes them
        (at most pacing.LONGEST later while a held snapshot paces it).
        """
        # A stopping worker's row may be gone by its own hand (the shutdown's last step, met
        # by this beat): registered again, it looked live for a lease after the process had
        # exited. It claims nothing more, so it needs no row; its rows claimed ahead still go.
        stopping = self.control.stopping.is_set()
        if not stopping:
            logger.warning("worker %s was presumed dead; registering again", self.worker_id)
        waiting = self.ledger.take_waiting()
        self.ledger.forget(waiting)
        if waiting:
            cursor.execute(sql.UNCLAIM, {"ids": waiting, "worker": self.worker_id})
            logger.warning("dropped %d job(s) claimed ahead: the rescue gave them back to the queue", len(waiting))
        if not stopping:
            cursor.execute(sql.REGISTER, self.options.registration(self.worker_id))
            self.ledger.fleet = (cursor.fetchone() or (1,))[0]

    def _run(
        self,
        conn: psycopg.Connection[Any],
        until: float,
        query: str,
        params: dict[str, Any],
        *,
        in_place: bool = False,
        refusable: bool = False,
    ) -> list[tuple[Any, ...]] | None:
        """Run one of the watchman's statements in a transaction of its own, before ``until``; None if it did not.

        ``in_place``: rows it finishes stay in axa_queue; ``refusable``: a refusal for a
        row's sake is raised as ``Refused`` (the watchman then writes row by row).
        """
        left = _left(until)
        if conn.closed or left is None:
            return None
        try:
            # Prepared at once (unless prepared statements are off): run every few seconds by
            # every worker, the workflow sweep and the look for unhandled jobs were planned
            # anew each time (2-3 ms of server CPU: most of what an idle worker cost it). Not
            # in a pipeline: a deferred constraint failing at its COMMIT (a user's foreign key)
            # left psycopg's pipeline unusable ("cannot exit pipeline mode while busy").
            prepare = True if conn.prepare_threshold is not None else None
            with conn.transaction(), conn.cursor() as cursor:
                cursor.execute(sql.TIMEOUTS, {"statement": left, "lock": left})
                if in_place:
                    cursor.execute(refused.IN_PLACE)
                cursor.execute(query, params, prepare=prepare)
                return cursor.fetchall() if cursor.description else []
        except psycopg.Error as error:
            if refusable and not isinstance(error, refused.OUTAGE):
                raise refused.Refused(error) from error
            logger.warning("housekeeping on the heartbeat's connection failed (%s); trying again later", error)
            return None


def _left(until: float) -> str | None:
    """The time left before ``until`` (monotonic), as a statement_timeout; None if it is up."""
    left = until - time.monotonic()
    return f"{max(50, round(left * 1000))}ms" if left > 0 else None
