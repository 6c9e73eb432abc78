"""The jobs a worker holds: claimed, handed to threads, finished with outcomes not yet written."""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable

from ..execution import Claimed, Outcome

logger = logging.getLogger("axa_django")

# A job thread takes no job while this many outcomes wait to be written: a worker killed
# runs again at most these (and its running jobs). Without it the threads outran the
# finisher at 27,000 no-op jobs/s and a SIGKILL ran 1,000-1,600 jobs twice (now 150-520);
# with the finisher's batches at half of it, drains were as fast as unbounded (medians
# of 6 interleaved drains: 22,482 vs 22,432 jobs/s; 512 cost 17%, 256 a third).
UNWRITTEN_MOST = 1024
# Job threads held up this long by unwritten outcomes say so: the database is not taking them.
STALL_SAID_AFTER = 1.0


class Ledger:
    """Every job from its claim until its outcome is written, shared by the worker's threads.

    The dispatcher holds claimed jobs and hands them out on ``work``; a job thread takes one,
    and when it ends (or the watchdog gives it up) ``finished`` counts it and puts its
    outcome on ``outcomes``; the finisher writes outcomes and calls ``written``.
    """

    def __init__(self) -> None:
        self.work: queue_module.SimpleQueue[Claimed | None] = queue_module.SimpleQueue()
        self.outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self.processed = 0  # attempts finished, retries included
        self.counts: Counter[str] = Counter()  # attempts finished by status
        # Whether the dispatcher's last claim filled its room: it then claims again as soon
        # as a thread frees, so a slot its finished jobs free is taken without waking others.
        self.backlog = False
        self._lock = threading.Lock()
        self._written = threading.Condition(self._lock)  # notified as the finisher writes outcomes
        self._in_flight: dict[uuid.UUID, Claimed] = {}
        self._unwritten = 0
        # Ids of the outcomes handed to the finisher and not yet written: the rows are still
        # running under this worker, and the reconcile must leave them (watchman.py). One
        # outcome per row at a time: a retry is claimed again only once it is written. A
        # set, whose add and difference_update cost a tenth of a Counter's per job.
        self._pending: set[uuid.UUID] = set()
        # Rows whose outcome the database refused in every form: left running under this
        # worker until it stops (then the rescue takes them), never reconciled meanwhile,
        # which ran such a job again every minute with no attempt counted.
        self._unwritable: set[uuid.UUID] = set()
        self._dropped: set[uuid.UUID] = set()  # lost attempts' outcomes the finisher did not write
        self._starts: dict[uuid.UUID, float] = {}  # claimed-ahead jobs started, started_at not yet written
        self._job_seconds: float | None = None  # moving average of a job's run time
        # Workers live within their lease, this one included, as the last registration or
        # beat read them (the dispatcher's rows claimed ahead shrink as the fleet grows).
        self.fleet = 1
        self._stuck: set[threading.Thread | None] = set()  # job threads given up at their timeout
        self._stalled_since: float | None = None  # when job threads began to wait for outcomes to be written
        # Ids whose outcomes were written while a claim ran (``claim_begins`` to ``claim_ends``):
        # an outcome written after the claim took its row again wrote over the new claim.
        self._claiming: set[uuid.UUID] | None = None

    # -- counts -------------------------------------------------------------------

    def held(self) -> int:
        """Jobs claimed and not yet finished (waiting for a thread or running)."""
        return len(self._in_flight)

    def waiting(self) -> int:
        """Jobs claimed and not yet taken by a thread."""
        return self.work.qsize()

    def running(self) -> int:
        """Jobs a thread has taken and not finished."""
        return len(self._in_flight) - self.work.qsize()

    def tally(self) -> tuple[int, dict[str, int]]:
        """Attempts finished, and by status, read together."""
        with self._lock:
            return self.processed, dict(self.counts)

    def unwritten(self) -> int:
        """Outcomes handed to the finisher and not yet written."""
        return self._unwritten

    def ids(self) -> list[uuid.UUID]:
        """Ids of every job held."""
        with self._lock:
            return list(self._in_flight)

    def unfinished(self) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """Ids of the jobs held: those without an outcome, and those whose outcome the finisher has."""
        with self._lock:
            ended = [job_id for job_id in self._in_flight if job_id in self._pending]
            return [job_id for job_id in self._in_flight if job_id not in self._pending], ended

    def owned(self) -> list[uuid.UUID]:
        """Ids of every job whose row this worker still owns: held, its outcome not yet written, or unwritable."""
        with self._lock:
            return [*self._in_flight, *self._pending, *self._unwritable]

    def unwritten_outcome(self, job_id: uuid.UUID) -> bool:
        """Whether this lost attempt's outcome is still to be written, was not (the stop came first, the
        row changed meanwhile) or cannot be; forgets that it was not."""
        with self._lock:
            if job_id in self._dropped:
                self._dropped.discard(job_id)
                return True
            return job_id in self._pending or job_id in self._unwritable

    def unwritable(self, job_id: uuid.UUID) -> None:
        """The database refused every form of this job's outcome: its row stays this worker's."""
        with self._lock:
            self._unwritable.add(job_id)

    def watched(self) -> list[Claimed]:
        """Jobs held that have a timeout."""
        with self._lock:
            return [job for job in self._in_flight.values() if job.watch is not None]

    @property
    def job_seconds(self) -> float | None:
        """A moving average of how long jobs ran, None before the first."""
        return self._job_seconds

    def timed(self, seconds: float) -> None:
        """Fold one job's run time into the average (a benign race: it only sizes the claim-ahead)."""
        average = self._job_seconds
        self._job_seconds = seconds if average is None else 0.8 * average + 0.2 * seconds

    # -- the life of a job ----------------------------------------------------------

    def hold(self, jobs: Iterable[Claimed]) -> None:
        """Hold ``jobs``, just claimed (``hand_out`` gives them to the job threads)."""
        with self._lock:
            for job in jobs:
                self._in_flight[job.id] = job

    def hand_out(self, jobs: Iterable[Claimed]) -> None:
        """Give held ``jobs`` to the job threads, in this order."""
        for job in jobs:
            self.work.put(job)

    def started(self, job: Claimed) -> float | None:
        """A thread starts ``job``: a job claimed ahead has its start kept until it is written (and returned)."""
        if not job.unmarked:
            return None  # its claim wrote started_at
        at = time.time()
        with self._lock:
            self._starts[job.id] = at
        return at

    def finished(self, job: Claimed, outcome: Outcome, *, started: float | None = None) -> None:
        """Hand ``job``'s outcome to the finisher; ``started``: when a claimed-ahead job began."""
        with self._lock:
            if job.unmarked:  # claimed ahead: the outcome writes when it started
                kept = self._starts.pop(job.id, None)
                outcome.started = started if started is not None else kept or time.time()
            self._unwritten += 1
            self._pending.add(outcome.id)
        outcome.frees_queue_slot = job.limited_queue
        self.outcomes.put(outcome)

    def release(self, job: Claimed, outcome: Outcome) -> None:
        """``job`` no longer holds a thread: count its attempt."""
        with self._lock:
            self._in_flight.pop(job.id, None)
            self.processed += 1
            self.counts[outcome.status] += 1

    def written(self, ids: list[uuid.UUID], dropped: Iterable[uuid.UUID] = ()) -> None:
        """The finisher is done with these outcomes (written or refused); ``dropped``: lost attempts' outcomes
        it did not write, which their job threads ask about (``unwritten_outcome``)."""
        with self._lock:
            self._unwritten -= len(ids)
            self._pending.difference_update(ids)
            self._dropped.update(dropped)
            if self._claiming is not None:
                self._claiming.update(ids)
            self._stalled_since = None
            self._written.notify_all()

    def claim_begins(self) -> None:
        """A claim starts: outcomes written from now on are noted until ``claim_ends``."""
        with self._lock:
            self._claiming = set()

    def claim_ends(self, ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
        """The claim took ``ids``; return those of which this worker still has an earlier attempt.

        Held (a thread runs it), its outcome not yet written, or written while the claim ran:
        the row was rescued meanwhile (an outage past the lease) and claimed again here. Its
        earlier attempt's outcome, written under FINISH's guard (running under this worker),
        would land on the new claim, and its ledger entries would be the new attempt's.
        """
        with self._lock:
            written, self._claiming = self._claiming or (), None
            held, pending = self._in_flight, self._pending
            return {job_id for job_id in ids if job_id in held or job_id in pending or job_id in written}

    def await_gone(self, ids: Iterable[uuid.UUID], timeout: float, abort: threading.Event) -> None:
        """Wait until no attempt of ``ids`` is held or unwritten, ``timeout`` at most (or ``abort``)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while any(job_id in self._in_flight or job_id in self._pending for job_id in ids) and not abort.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # A short wait: ``release`` (a thread's end) notifies nothing.
                self._written.wait(min(left, 0.05))

    def await_outcome(self, job_id: uuid.UUID, abort: threading.Event) -> None:
        """Wait until the finisher is done with ``job_id``'s outcome (or ``abort``): what FINISH made of it."""
        with self._lock:
            while job_id in self._pending and not abort.is_set():
                self._written.wait(0.5)  # the timeout sees ``abort``, which nothing notifies

    def await_written(self, abort: threading.Event) -> None:
        """Wait while UNWRITTEN_MOST outcomes or more are unwritten (until ``abort``).

        What bounds the jobs a killed worker has run and that run again: their outcomes
        were not written yet.
        """
        if self._unwritten < UNWRITTEN_MOST:  # read without the lock: a stale count only costs a look under it
            return
        with self._lock:
            while self._unwritten >= UNWRITTEN_MOST and not abort.is_set():
                now = time.monotonic()
                if self._stalled_since is None:
                    self._stalled_since = now
                elif now - self._stalled_since >= STALL_SAID_AFTER:
                    logger.warning(
                        "%d outcomes not written for %.1fs; job threads wait for the database to take them",
                        self._unwritten,
                        now - self._stalled_since,
                    )
                    self._stalled_since = float("inf")  # said once per stall
                self._written.wait(0.5)  # the timeout sees ``abort``, which nothing notifies

    def stuck(self, thread: threading.Thread | None) -> int:
        """A job thread was given up; return how many stuck threads live."""
        with self._lock:
            self._stuck = {*self.stuck_threads(), thread}  # those that ended are forgotten
            return len(self.stuck_threads())

    def stuck_threads(self) -> list[threading.Thread]:
        """The job threads given up that still live (one that returned after all has ended).

        Threads, not idents: a given-up thread that returned and ended left its ident to the
        next thread started, which counted stuck while it ran jobs; and one that returned
        before the watchdog counted it stayed counted for good (reviews).
        """
        return [thread for thread in list(self._stuck) if thread is not None and thread.is_alive()]

    def is_stuck(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` was given up (it may never return)."""
        return thread in self._stuck and thread.is_alive()

    # -- claimed ahead ---------------------------------------------------------------

    def has_starts(self) -> bool:
        """Whether claimed-ahead jobs have started with their started_at not written."""
        return bool(self._starts)

    def starts_before(self, cutoff: float) -> dict[uuid.UUID, float]:
        """Take the unwritten starts older than ``cutoff``, to write them."""
        with self._lock:
            due = {job_id: at for job_id, at in self._starts.items() if at <= cutoff}
            for job_id in due:
                del self._starts[job_id]
        return due

    def keep_starts(self, due: dict[uuid.UUID, float]) -> None:
        """Writing ``due`` failed: keep them for the next try."""
        with self._lock:
            self._starts.update(due)

    def take_waiting(self) -> list[uuid.UUID]:
        """Take every job no thread has started off ``work``; they stay held until ``forget``.

        The threads' ends (None) stay on ``work``: the heartbeat may take during a shutdown.
        """
        ids, ends = [], 0
        while True:
            try:
                job = self.work.get_nowait()
            except queue_module.Empty:
                break
            if job is None:
                ends += 1
            else:
                ids.append(job.id)
        for _ in range(ends):
            self.work.put(None)
        return ids

    def forget(self, ids: Iterable[uuid.UUID]) -> None:
        """Hold ``ids`` no more (given back to the queue unstarted)."""
        with self._lock:
            for job_id in ids:
                self._in_flight.pop(job_id, None)

    def cancel(self, job_ids: Iterable[uuid.UUID]) -> None:
        """Tell those of the jobs held that were cancelled (flagged in their rows, or notified)."""
        with self._lock:
            for job_id in job_ids:
                job = self._in_flight.get(job_id)
                if job is not None and job.context is not None:
                    job.context.cancel()
