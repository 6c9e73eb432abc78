"""The events every part of a worker obeys (wake, stop, abort, done) and the threads it started."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("axa_django")


# ``fatal`` when every job thread is stuck in a job past its timeout (no thread died).
STUCK = "stuck job"


class Control:
    """Stop, abort and wake a worker; start its threads so that one dying stops the worker (exit 1).

    ``wake`` rouses the dispatcher (a thread freed, an outcome written, a notification);
    ``stopping``: claim no more; ``aborting``: give jobs in progress back now; ``done``:
    the worker is gone, so the heartbeat and the watchdog stop. With a ``grace`` period,
    the first stop aborts once it has passed: every wait of a stop (jobs, outcomes, a
    reconnect through an outage) gives up on ``aborting``, so no outage holds it longer.
    """

    def __init__(self, grace: float | None = None) -> None:
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.aborting = threading.Event()
        self.done = threading.Event()
        self.fatal: str | None = None  # the thread whose death stopped the worker
        self.threads: list[threading.Thread] = []
        self.grace = grace
        self.deadline: float | None = None  # monotonic: when the first stop's grace period ends

    def rouse(self) -> None:
        """Set ``wake`` unless it is set: what a finished job does, so most cost no lock.

        Safe because every waiter clears ``wake``, then reads the state it waits on, then
        waits: a change made before this call is seen by the read, or sets ``wake`` anew.
        """
        if not self.wake.is_set():
            self.wake.set()

    def stop(self) -> None:
        """Claim no more; jobs in progress finish (within the grace period, if there is one)."""
        if self.grace is not None and self.deadline is None and not self.aborting.is_set():
            # Timed from the stop itself, not from when the dispatcher returns: during an
            # outage it may never return on its own (it waits for the jobs held).
            self.deadline = time.monotonic() + self.grace
            timer = threading.Timer(self.grace, self._grace_over)
            timer.name, timer.daemon = "axa-grace", True
            timer.start()
        self.stopping.set()
        self.wake.set()

    def _grace_over(self) -> None:
        if self.done.is_set() or self.aborting.is_set():
            return
        logger.warning(
            "grace period over (%gs since the stop): giving jobs in progress back to the queue; any the database "
            "cannot take now stay running under this worker until the rescue queues them again",
            self.grace,
        )
        self.abort()

    def abort(self) -> None:
        """Stop now, giving jobs in progress back to the queue."""
        self.aborting.set()
        self.stop()

    def die(self, what: str) -> None:
        """One of the worker's own threads is gone, one its running jobs need: stop everything, exit 1."""
        if self.fatal is None:
            self.fatal = what
        self.done.set()  # stop heartbeating at once: the lease rescues our jobs
        self.abort()

    def fail(self, what: str) -> None:
        """One of the worker's own threads is gone, one its running jobs do not need: stop, exit 1.

        As at a first signal, not an abort: a job given back while its thread still runs it
        (no thread can be stopped) was claimed and started by another worker within
        milliseconds, and ran twice at once. The heartbeat and the finisher carry the
        running jobs to their written outcomes; the grace period and a second signal abort.
        """
        if self.fatal is None:
            self.fatal = what
        self.stop()

    def spawn(self, target: Callable[[], None], name: str, *, needed: bool = True) -> threading.Thread:
        """Run ``target`` on a daemon thread; if it raises, the worker stops and exits 1.

        ``needed``: whether running jobs need the thread (``die``: they are given back);
        if not, they finish first (``fail``).
        """

        def guarded() -> None:
            try:
                target()
            except BaseException:
                if needed:
                    logger.critical("worker thread %s died; stopping the worker (exit 1)", name, exc_info=True)
                    self.die(name)
                else:
                    logger.critical(
                        "worker thread %s died; stopping the worker once its jobs in progress finish (exit 1)",
                        name,
                        exc_info=True,
                    )
                    self.fail(name)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread
