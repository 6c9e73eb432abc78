"""The watchdog: stops attempts at their timeout, and gives up threads that do not stop.

A sync job past its deadline gets JobTimeout raised in its thread (an async one has its
task cancelled by ``run_cancellable``). A thread that has not stopped within the grace
(blocked in C) is given up: the attempt is written as failed with JobTimeout, a new job
thread takes its slot, and whatever the old thread returns later is dropped. A worker
left with as many stuck threads as its concurrency stops as at a first signal (the
jobs its other threads run finish) and exits 1, so that its process manager starts a
clean one.
"""

from __future__ import annotations

import datetime
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import registry
from ..context import JobTimeout
from ..execution import Claimed, failure
from ..execution.timeouts import Watch
from .control import STUCK, Control
from .ledger import Ledger
from .options import Options

logger = logging.getLogger("axa_django")

# How often the watchdog looks when no deadline is nearer (it also wakes at each claim).
TICK = 0.5


class Watchdog:
    """Times each attempt that has a timeout; ``replace`` starts a job thread in a stuck one's place."""

    def __init__(
        self,
        options: Options,
        worker_id: uuid.UUID,
        control: Control,
        ledger: Ledger,
        replace: Callable[[], None],
    ) -> None:
        self.options, self.worker_id, self.control, self.ledger = options, worker_id, control, ledger
        self.replace = replace
        self._wake = threading.Event()

    def watch(self, job: Claimed, function: Any, timeout: float | None, claimed_at: Any) -> None:
        """Give a just-claimed attempt its timer: the row's timeout, else its job's."""
        if not (isinstance(timeout, float) and 0 < timeout < math.inf):
            # None, or a value only a hand-written row can hold (NaN, negative): the job's own.
            timeout = function.options.timeout if job.backend is None and function is not None else None
        if not timeout:
            return
        claimed = claimed_at if isinstance(claimed_at, datetime.datetime) else None
        job.watch = Watch(job.name, job.attempt, float(timeout), claimed, job.context)
        self._wake.set()

    def loop(self) -> None:
        """Fire timeouts and give up stuck threads until the worker is done."""
        grace = self.options.timeout_grace
        while not self.control.done.is_set():
            now = time.monotonic()
            nearest = now + TICK
            for job in self.ledger.watched():
                watch = job.watch
                assert watch is not None
                if watch.deadline is None:
                    continue  # not started yet (claimed ahead): its clock has not started
                if watch.fired_at is None:
                    if now >= watch.deadline:
                        logger.warning("job %s %s: %s", job.name, job.id, watch.message)
                        watch.fire()
                        nearest = min(nearest, now + grace)
                    else:
                        nearest = min(nearest, watch.deadline)
                elif not watch.abandoned:
                    if now >= watch.fired_at + grace:
                        self._give_up(job, watch)
                    else:
                        nearest = min(nearest, watch.fired_at + grace)
            self._wake.wait(max(0.01, nearest - time.monotonic()))
            self._wake.clear()

    def _give_up(self, job: Claimed, watch: Watch) -> None:
        if not watch.abandon():
            return  # its thread returned just now: its own outcome stands
        error = JobTimeout(
            f"{watch.message}; its thread did not stop within the {self.options.timeout_grace:g}s grace "
            "(blocked outside Python?), so the attempt was given up"
        )
        outcome = failure(job, registry.get(job.name), error, self.worker_id)
        self.ledger.finished(job, outcome)
        self.ledger.release(job, outcome)
        # Counted stuck once its job is no longer held: a stop that finds no job thread left
        # gives back what is still held, and would have given back this job, its thread
        # still in it.
        stuck = self.ledger.stuck(watch.thread)
        self.control.wake.set()
        if stuck >= self.options.concurrency:
            logger.critical(
                "%d job thread(s) are stuck in jobs past their timeout; exiting 1 so that the worker is restarted",
                stuck,
            )
            # As at a first signal, not an abort: the threads started in earlier stuck ones' places
            # may be running jobs, which an abort gave back while they ran (twice at once, review).
            self.control.fail(STUCK)
            return
        logger.error("job %s %s: its thread is stuck; starting a new job thread in its place", job.name, job.id)
        self.replace()
