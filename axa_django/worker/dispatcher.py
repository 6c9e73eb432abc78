"""The dispatcher: claims as many rows as threads can take soon (a burst worker: the rescue between claims)."""

from __future__ import annotations

import logging
import time
import uuid

from .. import housekeeping, sql
from .claimer import Claimer
from .connection import COALESCE, DispatcherConnection
from .control import Control
from .ledger import Ledger
from .limited import ADOPT_SECONDS, LimitedClaims
from .options import Options
from .quiet import Quiet
from .watchman import Watchman

logger = logging.getLogger("axa_django")

# Rows claimed ahead of free threads cover about this much of the jobs' observed run
# time: short jobs are claimed in batches of tens, a job of PREFETCH_HORIZON x
# concurrency or longer gets no row claimed ahead of it.
PREFETCH_HORIZON = 0.02
# A fleet of up to FLEET_SHARE workers each holds up to ``prefetch`` rows ahead; a larger
# one holds FLEET_SHARE x prefetch between them. A claim of rows ahead is a long
# transaction at the queue's head: 32 processes of 2,048 rows each on two cores spent
# more of the server a job than at 512 rows each (0.78x at 512, the drain no slower:
# benchmarks/results/pg15-fleet-ahead-ab.txt). Such a claim also locked the newest
# version of each row another worker claimed under it, and that row's finish waited;
# the walk passes those rows over now (sql.claims.UNTOUCHED).
FLEET_SHARE = 8
# A job claimed ahead and started longer ago than this gets its started_at written
# before its outcome; shorter jobs have it written with the outcome, at no cost.
MARK_AFTER = 0.05


class Dispatcher:
    """The main thread's loop: housekeeping when due, then a claim sized to the threads, then a wait."""

    def __init__(
        self,
        options: Options,
        worker_id: uuid.UUID,
        control: Control,
        ledger: Ledger,
        db: DispatcherConnection,
        claimer: Claimer,
        limited: LimitedClaims,
        quiet: Quiet,
        watchman: Watchman,
    ) -> None:
        self.options, self.worker_id, self.control, self.ledger = options, worker_id, control, ledger
        self.db, self.claimer, self.limited, self.quiet = db, claimer, limited, quiet
        self.watchman = watchman
        self._next_adopt = 0.0
        self._last_claimed = 0  # rows the last claim took: the next takes at most twice as many

    def register(self) -> None:
        """Write this worker's row."""
        rows = self.db.execute(sql.REGISTER, self.options.registration(self.worker_id))
        if rows:
            self.ledger.fleet = rows[0][0]

    def run(self, names: list[str]) -> None:
        """Claim and hand out rows of ``names`` until stopped (a burst worker: until none are left)."""
        options, control, ledger = self.options, self.control, self.ledger
        next_housekeeping = 0.0
        claimed_total = 0
        backlog = False
        # After a claim that found all there was (fewer rows than asked): the news count it
        # began at, and until when the worker may wait (the next due row, the poll interval).
        idle: tuple[int, float] | None = None
        while not control.stopping.is_set():
            now = time.monotonic()
            if now >= next_housekeeping:
                next_housekeeping = now + self.housekeep()
            if ledger.has_starts():
                self._mark_started()
            if options.max_jobs is not None and claimed_total >= options.max_jobs and not ledger.held():
                break
            control.wake.clear()
            room = self._room(claimed_total, backlog)
            if room <= 0:
                self._wait(next_housekeeping - time.monotonic())
                continue
            if backlog and room < options.concurrency and not self._ahead():
                # More rows are waiting and other threads are about to free up: wait
                # a moment for them, so that one claim serves several.
                room = self._gather(claimed_total)
            if idle is not None:
                news, until = idle
                if news == self.quiet.news and self.quiet.heard_all and not options.burst and time.monotonic() < until:
                    # Woken by a job's end (or a thread given up) with nothing announced since
                    # the last claim found all there was: another would find nothing. At a
                    # steady trickle that claim was one of every job's two.
                    self._idle_wait(until - time.monotonic())
                    continue
                idle = None
            # Read before claiming: an outcome written after the claim (a retry
            # queued again) must get another claim before a burst worker exits.
            settled = not ledger.held() and not ledger.unwritten()
            control.wake.clear()
            news = self.quiet.news
            free = options.concurrency - ledger.running()
            tried_all = not self.quiet.any()  # a kind that came back empty lately is skipped (quiet.py)
            jobs = self.claimer.claim(names, room, ahead=room > free)
            if jobs is None:  # database trouble: already logged and backed off
                continue
            claimed_total += len(jobs)
            self._last_claimed = len(jobs)
            backlog = ledger.backlog = len(jobs) == room
            ledger.hand_out(jobs)
            if self.claimer.given_back:
                # Rows claimed again while an earlier attempt here was not done with, given back:
                # the next claim takes them again until that attempt's outcome is written.
                ledger.await_gone(self.claimer.given_back, options.poll_interval, control.stopping)
            if jobs and len(jobs) < room:
                # Idle threads were handed these: let one take the GIL and start them before
                # this thread goes on to look for the next due row. At a trickle, commit to
                # start 0.03-0.08 ms sooner (benchmarks/results/pg15-pickup-yield-ab.txt).
                time.sleep(0)
            if not jobs:
                self.quiet.stir(news=False)  # idle: the next claim tries every kind again
                if not tried_all:
                    continue  # at once: a burst worker must not stop, nor any worker wait, on a skipped kind
            if len(jobs) < room:
                if options.burst and not jobs:
                    if settled and self.quiet.token_due is None:
                        break
                    self._wait(next_housekeeping - time.monotonic())
                    continue
                if not jobs or (tried_all and self.quiet.heard_all and not options.burst):
                    # Fewer rows than asked for, every kind tried: none other is ready now. The
                    # worker claims again on news, when its next row falls due, or when it polls.
                    longest = self.quiet.idle_wait(options.poll_interval, options.housekeeping_interval)
                    timeout = min(self.claimer.next_run(names), next_housekeeping - time.monotonic())
                    idle = (news, time.monotonic() + min(timeout, longest))
                    if not jobs:
                        self._idle_wait(min(timeout, longest))

    def _room(self, claimed_total: int, backlog: bool) -> int:
        """How many rows to claim now; 0 while threads are busy and enough rows wait for them.

        With a backlog, rows are claimed ahead of free threads (``_ahead``) and claimed
        again once half of those have been taken, so that a burst of short jobs never
        waits on a round trip; without one, only for threads left with nothing to do.
        """
        ledger, options = self.ledger, self.options
        waiting = ledger.waiting()
        running = ledger.held() - waiting
        ahead = self._ahead()
        if waiting > (ahead // 2 if backlog else 0) or (not backlog and running >= options.concurrency):
            return 0
        # Twice the last claim at most: a claim's time grows with its rows (13 us each on the
        # server), and a burst's first claim of every row ahead kept the threads idle 18 ms;
        # doubling, each claim comes in while the threads run the one before.
        room = min(options.concurrency + ahead - ledger.held(), max(options.concurrency, 2 * self._last_claimed))
        if options.max_jobs is not None:
            room = min(room, options.max_jobs - claimed_total)
        return room

    def _ahead(self) -> int:
        """Rows to hold beyond free threads: PREFETCH_HORIZON of the jobs seen so far, at most ``prefetch``
        (its share of FLEET_SHARE x ``prefetch`` in a larger fleet)."""
        seconds = self.ledger.job_seconds
        options = self.options
        if seconds is None or not options.prefetch:
            return 0
        share = options.prefetch * FLEET_SHARE // max(self.ledger.fleet, FLEET_SHARE)
        return min(share, int(options.concurrency * PREFETCH_HORIZON / max(seconds, 1e-6)))

    def _idle(self, claimed_total: int) -> int:
        idle = self.options.concurrency - self.ledger.held()
        if self.options.max_jobs is not None:
            idle = min(idle, self.options.max_jobs - claimed_total)
        return idle

    def _gather(self, claimed_total: int) -> int:
        deadline = time.monotonic() + COALESCE
        wake = self.control.wake
        while (idle := self._idle(claimed_total)) < self.options.concurrency:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            wake.clear()
            if self._idle(claimed_total) == idle:  # nothing freed since we looked
                wake.wait(left)
        return idle

    def _wait(self, timeout: float) -> None:
        if self.ledger.has_starts():
            timeout = min(timeout, MARK_AFTER)
        self.control.wake.wait(max(0.0, min(timeout, self.options.poll_interval)))

    def _idle_wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for news (the fleet's poller announces rows fallen due unannounced)."""
        if self.ledger.has_starts():
            timeout = min(timeout, MARK_AFTER)
        self.control.wake.wait(max(0.0, timeout))

    def _mark_started(self) -> None:
        """Write started_at of claimed-ahead jobs running past MARK_AFTER: a lost worker then counts them a loss."""
        due = self.ledger.starts_before(time.time() - MARK_AFTER)
        if due:
            params = {"ids": list(due), "at": list(due.values()), "worker": self.worker_id}
            if self.db.execute(sql.MARK_STARTED, params) is None:
                self.ledger.keep_starts(due)  # try again at the next turn

    def housekeep(self) -> float:
        """The adoption of unkeyed limited rows (and for a burst worker, the watchman's work, periodic
        jobs and pruning); seconds until the next."""
        options = self.options
        interval = options.housekeeping_interval
        if time.monotonic() >= self._next_adopt:
            self._next_adopt = time.monotonic() + ADOPT_SECONDS
            self.limited.adopt_unkeyed(options.handler_names())
        # The rescue and the look for unhandled jobs run on the heartbeat's thread (watchman.py);
        # periodic jobs and retention on a thread of their own (maintenance.py). A burst
        # worker, which may stop after one claim, does them here.
        if options.burst:
            self.watchman.watch(self.db.bounded)
        soonest = housekeeping.run(options) if options.burst else None
        if soonest is not None:
            interval = max(0.01, min(interval, soonest))
        return interval

    def unclaim_waiting(self) -> None:
        """Give back the rows claimed ahead that no thread has started, as if never claimed."""
        ids = self.ledger.take_waiting()
        if ids and self.db.execute(sql.UNCLAIM, {"ids": ids, "worker": self.worker_id}) is not None:
            logger.info("gave %d job(s) claimed ahead back to the queue, unstarted", len(ids))
        self.ledger.forget(ids)

    def unclaim_held(self) -> None:
        """Once no job thread is left: give back every job still held, as if never claimed.

        Claimed and held, never handed out (the dispatcher died between the two), or taken by a
        thread that died outside its job: no thread will run them, and the stop waited for them
        for ever, heartbeating their lease (review).
        """
        ids, ended = self.ledger.unfinished()
        if ids and self.db.execute(sql.UNCLAIM, {"ids": ids, "worker": self.worker_id}) is not None:
            logger.warning("gave %d job(s) no job thread was left to run back to the queue", len(ids))
        # Ran already, their thread dying after handing the outcome on: the finisher writes it.
        self.ledger.forget([*ids, *ended])
