"""The worker: claims jobs in batches, hands them to threads, writes outcomes, stays alive.

One process holds ``concurrency`` job threads plus four connections of its own: the
dispatcher (claims, rescue, housekeeping), the heartbeat (the lease on this worker's
jobs, on a thread that waits on nothing else), the listener (LISTEN axa_queue) and
the finisher (writes outcomes in batches, retrying through outages). Job threads open
a Django connection only if the job's own code uses the database. Any of the worker's
own threads dying ends the process with exit code 1, so that a process manager
restarts it instead of keeping a worker that heartbeats but does no work.

This module holds the dispatcher and shutdown; ``workerdb`` the connections and
start-up checks, ``workerloops`` the thread bodies (both mixed into ``Worker``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue as queue_module
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from django.db import connections

from . import conf, dependencies, housekeeping, registry, sql, unhandled
from .claimlanes import Lanes
from .context import JobContext
from .execution import (
    Claimed,
    NoHandler,
    Outcome,
    perform,
)
from .logs import plural, summary
from .maintenance import Maintenance
from .queuelimits import QueueClaim
from .selection import UnknownJobs, check_names, check_queue
from .workerdb import (
    COALESCE,
    CannotConnect,
    Connections,
    NotMigrated,
    PoolerMisconfigured,
    connect,
    keepalives,
    task_backend_aliases,
)
from .workerflow import ADOPT_SECONDS, FlowLoops
from .workerloops import Loops, unstorable

__all__ = [
    "CannotConnect",
    "Claimed",
    "NoHandler",
    "NotMigrated",
    "Outcome",
    "PoolerMisconfigured",
    "UnknownJobs",
    "Worker",
    "connect",
    "keepalives",
    "perform",
    "task_backend_aliases",
    "unstorable",
]

logger = logging.getLogger("axa_django")

# Rows claimed ahead of free threads cover about this much of the jobs' observed run
# time: short jobs are claimed in batches of tens, a job of PREFETCH_HORIZON x
# concurrency or longer gets no row claimed ahead of it.
PREFETCH_HORIZON = 0.02
PREFETCH_PER_THREAD = 8
# A job claimed ahead and started longer ago than this gets its started_at written
# before its outcome; shorter jobs have it written with the outcome, at no cost.
MARK_AFTER = 0.05


class Worker(Connections, Loops, FlowLoops):
    """Runs jobs until stopped; ``run()`` returns the process exit code."""

    def __init__(
        self,
        *,
        concurrency: int = 4,
        poll_interval: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        queues: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        grace_period: float | None = None,
        using: str | None = None,
        install_signals: bool = True,
        log_attempts: bool = False,
        timeout_grace: float = 5.0,
        prefetch: int | None = None,
        health_file: str | None = None,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be a positive whole number, not {concurrency!r}")
        if poll_interval is not None and not (isinstance(poll_interval, int | float) and poll_interval > 0):
            raise ValueError(f"poll_interval must be a positive number of seconds, not {poll_interval!r}")
        if max_jobs is not None and (type(max_jobs) is not int or max_jobs < 1):
            raise ValueError(f"max_jobs must be a positive whole number, not {max_jobs!r}")
        if grace_period is not None and not (isinstance(grace_period, int | float) and grace_period >= 0):
            raise ValueError(f"grace_period must be a number of seconds >= 0, not {grace_period!r}")
        if prefetch is not None and (type(prefetch) is not int or prefetch < 0):
            raise ValueError(f"prefetch must be a whole number >= 0, not {prefetch!r}")
        self._init_flow(timeout_grace)
        self.id = uuid.uuid4()
        self.concurrency = concurrency
        # At most this many rows claimed and not yet started (0: claim for free threads only).
        self.prefetch = PREFETCH_PER_THREAD * concurrency if prefetch is None else prefetch
        self.poll_interval = float(poll_interval or conf.get("POLL_INTERVAL"))
        self.burst = burst
        self.max_jobs = max_jobs
        self.queues = sorted({check_queue(queue) for queue in queues}) if queues else None
        self.names = check_names(names) if names is not None else None
        # django.tasks rows are claimed by backend alias; --job names only background jobs.
        self.backends = task_backend_aliases() if names is None else []
        self.grace_period = grace_period
        self.using = using or conf.get("DATABASE")
        self.install_signals = install_signals
        self.log_attempts = log_attempts
        self.health_file = health_file  # touched at start and at each acknowledged heartbeat
        self.lease = float(conf.get("LEASE_SECONDS"))
        self.stale_minutes = int(conf.get("STALE_MINUTES"))
        self.pooling = bool(conf.get("TRANSACTION_POOLING"))
        self.notify = bool(conf.get("NOTIFY")) and not self.pooling
        self.processed = 0  # attempts finished, retries included
        self.outcomes: Counter[str] = Counter()

        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._aborting = threading.Event()
        self._done = threading.Event()  # set when the worker is gone: the heartbeat stops
        self._listening = threading.Event()
        self._probe_seen = threading.Event()
        self._probe = f"probe:{self.id}"
        self._fatal: str | None = None
        self._failing_since: float | None = None
        self._work: queue_module.SimpleQueue[Claimed | None] = queue_module.SimpleQueue()
        self._outcomes: queue_module.SimpleQueue[Outcome | None] = queue_module.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight: dict[uuid.UUID, Claimed] = {}
        self._unwritten = 0
        self._job_seconds: float | None = None  # moving average of a job's run time
        self._starts: dict[uuid.UUID, float] = {}  # claimed-ahead jobs started, started_at not yet written
        self._conn: psycopg.Connection[Any] | None = None
        self._threads: list[threading.Thread] = []
        self._signals = 0
        self._signal_queue: queue_module.SimpleQueue[int | None] = queue_module.SimpleQueue()
        self._statements: dict[tuple[str, tuple[str, ...]], str] = {}
        self._queue_claims: dict[tuple[str, ...], QueueClaim] = {}  # by the names it claims
        self._lanes = Lanes(notified=self.notify)  # where the plain claim walks from, per (name, priority)
        self._lane_statements: dict[tuple[tuple[str, ...], tuple[tuple[str, int], ...]], str] = {}
        # The first look waits a lease: workers started together have all registered by then.
        self._next_unhandled = time.monotonic() + self.lease
        self._next_rescue = 0.0

    # -- control -----------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; jobs in progress finish, then run() returns 0."""
        self._stopping.set()
        self._wake.set()

    def abort(self) -> None:
        """Stop now: give in-progress jobs back to the queue; run() returns 1."""
        self._aborting.set()
        self.stop()

    def _die(self, what: str) -> None:
        """One of the worker's own threads is gone: stop everything, exit 1."""
        if self._fatal is None:
            self._fatal = what
        self._done.set()  # stop heartbeating at once: the lease rescues our jobs
        self.abort()

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A handler runs between two bytecodes of the main thread, which may be inside one
        # of the Events stop() sets, holding its lock: setting it here would deadlock. A
        # SimpleQueue's put is reentrant, so the signal goes to a thread of its own.
        self._signal_queue.put(signum)

    def _signal_loop(self) -> None:
        while (signum := self._signal_queue.get()) is not None:
            self._handle_signal(signum)

    def _handle_signal(self, signum: int) -> None:
        """Stop at the first SIGTERM/SIGINT, abort at the second."""
        self._signals += 1
        if self._signals == 1:
            logger.info("received %s: finishing jobs in progress (again to abort)", signal.Signals(signum).name)
            self.stop()
        else:
            logger.warning("received %s again: giving jobs in progress back to the queue", signal.Signals(signum).name)
            self.abort()

    # -- main loop ---------------------------------------------------------------

    def handler_names(self) -> list[str]:
        """Names of jobs this worker claims."""
        names = sorted(registry.registry) if self.names is None else self.names
        return [name for name in names if name in registry.registry]

    def run(self) -> int:
        """Run until stopped (or drained with burst); return the exit code."""
        previous = {}
        if self.install_signals and threading.current_thread() is threading.main_thread():
            threading.Thread(target=self._signal_loop, name="axa-signals", daemon=True).start()
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if previous:
                self._signal_queue.put(None)

    def _run(self) -> int:
        names = self.handler_names()
        self._conn = self._first_connection()
        if self._conn is None:
            logger.info("worker %s stopped after 0 attempts: it never reached the database", self.id)
            return 1 if self._aborting.is_set() else 0
        settings = connections[self.using].settings_dict
        logger.info(
            "worker %s starting: concurrency %d, %s (%s), task backends %s, queues %s, database %s on %s",
            self.id,
            self.concurrency,
            plural(len(names), "handler"),
            ", ".join(names) or "none",
            ", ".join(self.backends) or "none",
            ", ".join(self.queues) if self.queues else "all",
            settings.get("NAME"),
            settings.get("HOST") or "local",
        )
        self._check_tables()
        self._check_pooler()
        self._register()
        self._spawn(self._heartbeat_loop, "axa-heartbeat")
        self._rescue()
        # Once, off the hot path: ready rows of names this code does not know are said now, not a lease later.
        unhandled.warn_at_start(
            functools.partial(self._execute, bounded=True), lease=self.lease, registered=registry.registry
        )
        self._start_threads()
        if not self.burst:
            maintenance = Maintenance(self, self._housekeeping_interval(), self._stopping)
            self._spawn(maintenance.loop, "axa-maintenance")
        if self.notify:
            self._check_notify()
        try:
            self._dispatch(names)
        except BaseException:
            logger.critical("the dispatcher failed; stopping the worker", exc_info=True)
            self._die("dispatcher")
        return self._shutdown()

    def _dispatch(self, names: list[str]) -> None:
        next_housekeeping = 0.0
        claimed_total = 0
        backlog = False
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_housekeeping:
                next_housekeeping = now + self._housekeep()
            if self._starts:
                self._mark_started()
            if self.max_jobs is not None and claimed_total >= self.max_jobs and not self._in_flight:
                break
            self._wake.clear()
            room = self._room(claimed_total, backlog)
            if room <= 0:
                self._wait(next_housekeeping - time.monotonic())
                continue
            if backlog and room < self.concurrency and not self._ahead():
                # More rows are waiting and other threads are about to free up: wait
                # a moment for them, so that one claim serves several.
                room = self._gather(claimed_total)
            # Read before claiming: an outcome written after the claim (a retry
            # queued again) must get another claim before a burst worker exits.
            settled = not self._in_flight and not self._unwritten
            self._wake.clear()
            free = self.concurrency - (len(self._in_flight) - self._work.qsize())
            tried_all = not self._quiet  # a kind that came back empty lately is skipped (workerflow.py)
            jobs = self._claim(names, room, ahead=room > free)
            if jobs is None:  # database trouble: already logged and backed off
                continue
            claimed_total += len(jobs)
            backlog = self._backlog = len(jobs) == room
            for job in jobs:
                self._work.put(job)
            if not jobs:
                self._stir()  # idle: the next claim tries every kind again
                if not tried_all:
                    continue  # at once: a burst worker must not stop, nor any worker wait, on a skipped kind
            if len(jobs) < room:
                if self.burst and not jobs:
                    if settled and self._token_due is None:
                        break
                    self._wait(next_housekeeping - time.monotonic())
                    continue
                if not jobs:
                    self._wait(min(self._next_run(names), next_housekeeping - time.monotonic()))

    def _room(self, claimed_total: int, backlog: bool) -> int:
        """How many rows to claim now; 0 while threads are busy and enough rows wait for them.

        With a backlog, rows are claimed ahead of free threads (``_ahead``) and claimed
        again once half of those have been taken, so that a burst of short jobs never
        waits on a round trip; without one, only for threads left with nothing to do.
        """
        waiting = self._work.qsize()  # claimed, not yet taken by a thread
        running = len(self._in_flight) - waiting
        ahead = self._ahead()
        if waiting > (ahead // 2 if backlog else 0) or (not backlog and running >= self.concurrency):
            return 0
        room = self.concurrency + ahead - len(self._in_flight)
        if self.max_jobs is not None:
            room = min(room, self.max_jobs - claimed_total)
        return room

    def _ahead(self) -> int:
        """Rows to hold beyond free threads: PREFETCH_HORIZON of the jobs seen so far, at most ``prefetch``."""
        seconds = self._job_seconds
        if seconds is None or not self.prefetch:
            return 0
        return min(self.prefetch, int(self.concurrency * PREFETCH_HORIZON / max(seconds, 1e-6)))

    def _idle(self, claimed_total: int) -> int:
        idle = self.concurrency - len(self._in_flight)
        if self.max_jobs is not None:
            idle = min(idle, self.max_jobs - claimed_total)
        return idle

    def _gather(self, claimed_total: int) -> int:
        deadline = time.monotonic() + COALESCE
        while (idle := self._idle(claimed_total)) < self.concurrency:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.clear()
            if self._idle(claimed_total) == idle:  # nothing freed since we looked
                self._wake.wait(left)
        return idle

    def _housekeeping_interval(self) -> float:
        return max(0.05, self.lease / 3)

    def _wait(self, timeout: float) -> None:
        if self._starts:
            timeout = min(timeout, MARK_AFTER)
        self._wake.wait(max(0.0, min(timeout, self.poll_interval)))

    # -- database steps ----------------------------------------------------------

    def _register(self) -> None:
        self._execute(sql.REGISTER, self._registration())

    def _registration(self) -> dict[str, Any]:
        return {
            "worker": self.id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.concurrency,
            "queues": json.dumps(self.queues or []),
            "names": json.dumps(self.handler_names()),
            "backends": json.dumps(self.backends),
        }

    def _rescue(self) -> None:
        params = {"lease": self.lease, "stale": self.stale_minutes, "max_losses": int(conf.get("MAX_LOSSES"))}
        rows = self._execute(sql.RESCUE, params, bounded=True)
        if rows:
            failed = sum(1 for _, status in rows if status == "failed")
            logger.warning(
                "requeued %d job(s) whose worker stopped%s",
                len(rows) - failed,
                f"; {failed} more had lost their worker max_losses times and failed" if failed else "",
            )
        rows = self._execute(sql.FAIL_NEVER_DUE, {}, bounded=True)
        if rows:
            logger.warning("failed %d job(s) whose run_at was 'infinity'", len(rows))
        self._execute(dependencies.SWEEP, {}, bounded=True)  # children of parents ended outside a finisher

    def _housekeep(self) -> float:
        """Rescue and its kin (and for a burst worker, periodic jobs and pruning); seconds until the next."""
        interval = self._housekeeping_interval()
        # Periodic jobs may wake housekeeping every second; dead workers are looked for
        # only every lease/3, as the lease needs.
        if time.monotonic() >= self._next_rescue:
            self._next_rescue = time.monotonic() + interval
            self._rescue()
        if time.monotonic() >= self._next_adopt:
            self._next_adopt = time.monotonic() + ADOPT_SECONDS
            self._adopt_unkeyed(self.handler_names())
        if time.monotonic() >= self._next_unhandled:
            self._next_unhandled = time.monotonic() + unhandled.CHECK_SECONDS
            rows = self._execute(sql.UNHANDLED, unhandled.params(self.lease), bounded=True)
            unhandled.warn(unhandled.rows_to_unhandled(rows or []))
        # Periodic jobs and retention have a thread of their own (maintenance.py); a burst
        # worker, which may stop after one claim, does one round here.
        soonest = housekeeping.run(self) if self.burst else None
        if soonest is not None:
            interval = max(0.01, min(interval, soonest))
        return interval

    def _claim(self, names: list[str], limit: int, ahead: bool = False) -> list[Claimed] | None:
        """Claim up to ``limit`` rows; ``ahead``: more than there are free threads, started_at left for later."""
        if not names and not self.backends:
            return []
        # Jobs with a concurrency or rate limit first (workerflow.py), then the others as ever.
        free = max(0, self.concurrency - (len(self._in_flight) - self._work.qsize()))
        rows = self._claim_limited(names, limit, free, ahead)
        limited = self._limited_names(names)
        fast = [name for name in names if name not in limited]
        if len(rows) < min(limit, free) and (fast or self.backends) and self._due("queues"):
            rows += self._quieted("queues", self._claim_queues(fast, min(limit, free) - len(rows)), self._stirs)
        if len(rows) < limit and (fast or self.backends) and self._due("plain"):
            stirs = self._stirs
            more = self._claim_plain(fast, limit - len(rows), ahead)
            if more is None and not rows:
                return None
            rows += self._quieted("plain", more or [], stirs) if limited else more or []
        rows.sort(key=lambda row: (-row[7], row[8]))  # the claims' own order: threads take the best first
        jobs = [
            Claimed(job_id, name, None, attempt, max_attempts, backend, args_json=args, unmarked=unmarked)
            for job_id, name, args, attempt, max_attempts, backend, unmarked, *_ in rows
        ]
        with self._lock:
            for job in jobs:
                function = registry.get(job.name) if job.backend is None else None
                # A task row may be async; its context lets a cancel reach it.
                if job.backend is not None or (function is not None and (function.takes_context or function.is_async)):
                    job.context = JobContext(job.id, job.name, job.attempt, self.id)
                self._in_flight[job.id] = job
        for job, row in zip(jobs, rows, strict=True):
            self._watch(job, function=registry.get(job.name), timeout=row[10], claimed_at=row[11])
        return jobs

    def _claim_plain(self, names: list[str], limit: int, ahead: bool) -> list[tuple[Any, ...]] | None:
        """Claim up to ``limit`` rows of jobs without limits, each lane walked from its floor (claimlanes.py)."""
        params: dict[str, Any] = {"worker": self.id, "limit": limit, "ahead": ahead}
        lanes = self._lanes
        bounded = lanes.bounded()
        if bounded:
            key = lanes.key(names)
            statement = self._lane_statements.get((tuple(names), key))
            if statement is None:
                statement = sql.compose(sql.CLAIM_LANES, names, self.backends, self.queues, lanes=key)
                self._lane_statements[(tuple(names), key)] = statement
            params["floors"] = lanes.floors(key)
        else:
            statement = self._composed(sql.CLAIM_FULL, names)
        rows = self._execute(statement, params)
        if rows is None:
            lanes.forget()
            return None
        claimed = [row[:12] for row in rows if row[0] is not None]
        snap = next((row[12:] for row in rows if row[0] is None), None)
        if snap is not None:
            lanes.learn(claimed, snap, full=not bounded)
        return claimed

    def _claim_queues(self, names: list[str], limit: int) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` rows of queues with a fleet-wide limit (queuelimits.py), for free threads."""
        conn = self._conn
        if conn is None or conn.closed:
            return []
        key = tuple(names)
        if key not in self._queue_claims:
            self._queue_claims[key] = QueueClaim(self.id, names, self.backends, self.queues)
        try:
            return self._queue_claims[key].claim(conn, limit)
        except psycopg.Error as error:
            self._claim_failed("jobs of limited queues", conn, error)
            return []

    def _mark_started(self) -> None:
        """Write started_at of claimed-ahead jobs running past MARK_AFTER: a lost worker then counts them a loss."""
        cutoff = time.time() - MARK_AFTER
        with self._lock:
            due = {job_id: at for job_id, at in self._starts.items() if at <= cutoff}
            for job_id in due:
                del self._starts[job_id]
        if (
            due
            and self._execute(sql.MARK_STARTED, {"ids": list(due), "at": list(due.values()), "worker": self.id}) is None
        ):
            with self._lock:
                self._starts.update(due)  # try again at the next turn

    def _composed(self, template: str, names: list[str]) -> str:
        # Names, backends and queues do not change while the worker runs; sent as
        # parameters, psycopg adapted the same arrays on every claim (measured:
        # 5,200 -> 8,000 no-op jobs/s per process), so they are written in once.
        key = (template, tuple(names))
        if key not in self._statements:
            self._statements[key] = sql.compose(template, names, self.backends, self.queues)
        return self._statements[key]

    def _next_run(self, names: list[str]) -> float:
        if not names and not self.backends:
            return self.poll_interval
        rows = self._execute(self._composed(sql.NEXT_RUN, names), {})
        if not rows or rows[0][0] is None:
            return self._token_wait(self.poll_interval)
        return self._token_wait(float(rows[0][0]))

    # -- threads -----------------------------------------------------------------

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            self._spawn(self._job_loop, f"axa-job-{index}")
        self._spawn(self._finish_loop, "axa-finisher")
        self._spawn(self._watchdog_loop, "axa-watchdog")
        if self.notify:
            self._spawn(self._listen_loop, "axa-listener")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        def guarded() -> None:
            try:
                target()
            except BaseException:
                logger.critical("worker thread %s died; stopping the worker (exit 1)", name, exc_info=True)
                self._die(name)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _shutdown(self) -> int:
        self._stopping.set()
        self._unclaim_waiting()
        for _ in range(self.concurrency):
            self._work.put(None)
        deadline = None if self.grace_period is None else time.monotonic() + self.grace_period
        while self._in_flight and not self._aborting.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                logger.warning("grace period over with %d job(s) still running", len(self._in_flight))
                self._aborting.set()
                break
            self._wake.clear()
            if self._in_flight:
                self._wake.wait(0.1 if remaining is None else min(0.1, remaining))
        if self._aborting.is_set():
            with self._lock:
                ids = list(self._in_flight)
            if ids:
                self._execute(sql.RELEASE, {"ids": ids, "worker": self.id})
                logger.warning("gave %d job(s) back to the queue", len(ids))
        else:
            # Every job has finished; wait for the finisher to write their outcomes.
            while self._unwritten and self._fatal is None:
                self._wake.clear()
                if self._unwritten:
                    self._wake.wait(0.1)
        self._outcomes.put(None)
        if self.notify:
            self._execute(sql.WAKE, {})  # lets the listener see that we stop
        for thread in self._threads:
            if thread.ident in self._stuck:
                continue  # stuck in a job past its timeout: it may never return
            waits = thread.name in ("axa-finisher", "axa-listener") or not self._aborting.is_set()
            if waits and thread.name not in ("axa-heartbeat", "axa-watchdog"):
                thread.join(timeout=None if not self._aborting.is_set() else 5)
        # A burst worker names the ready jobs it leaves, looked up while it is still registered.
        left = self._left_behind() if self.burst and not self._aborting.is_set() else []
        self._execute(sql.UNREGISTER, {"worker": self.id})
        self._done.set()
        self._close(self._conn)
        if self._fatal is not None:
            logger.critical("worker %s stopped because its %s thread died", self.id, self._fatal)
            return 1
        said = summary(self.processed, self.outcomes)
        if left:
            logger.warning(
                "worker %s stopped after %s; ready jobs it could not run: %s", self.id, said, "; ".join(left)
            )
        else:
            logger.info("worker %s stopped after %s", self.id, said)
        return 1 if self._aborting.is_set() else 0

    def _left_behind(self) -> list[str]:
        return unhandled.left_behind(
            self._execute,
            names=self.handler_names(),
            backends=self.backends,
            queues=self.queues,
            lease=self.lease,
            registered=registry.registry,
        )

    def _unclaim_waiting(self) -> None:
        """Give back the rows claimed ahead that no thread has started, as if never claimed."""
        ids = []
        while True:
            try:
                job = self._work.get_nowait()
            except queue_module.Empty:
                break
            if job is not None:
                ids.append(job.id)
        if not ids:
            return
        if self._execute(sql.UNCLAIM, {"ids": ids, "worker": self.id}) is not None:
            logger.info("gave %d job(s) claimed ahead back to the queue, unstarted", len(ids))
        with self._lock:
            for job_id in ids:
                self._in_flight.pop(job_id, None)
