"""The worker: claims jobs in batches, hands them to threads, writes outcomes, stays alive.

One process holds ``concurrency`` job threads plus four connections of its own: the
dispatcher (claims, rescue, housekeeping), the heartbeat (the lease on this worker's
jobs, on a thread that waits on nothing else), the listener (LISTEN axa_queue) and
the finisher (writes outcomes in batches, retrying through outages). Job threads open
a Django connection only if the job's own code uses the database. Any of the worker's
own threads dying ends the process with exit code 1, so that a process manager
restarts it instead of keeping a worker that heartbeats but does no work.
"""

from __future__ import annotations

import contextlib
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

import django
import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import conf, dberrors, housekeeping, registry, sql, unhandled
from .context import JobContext
from .execution import (
    Claimed,
    NoHandler,
    Outcome,
    failure,
    finish,
    leaked,
    log_receiver_errors,
    perform,
    release_connections,
    send_finished,
    storable,
)
from .logs import attempt_line, plural, summary
from .selection import UnknownJobs, check_names, check_queue
from .signals import job_started

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
    "perform",
]

logger = logging.getLogger("axa_django")

CHANNEL = "axa_queue"
_RECONNECT_MAX = 5.0
_COALESCE = 0.0005
# Housekeeping statements (rescue, never-due rows) may not hold the dispatcher longer.
_STATEMENT_TIMEOUT = "5s"
_LOCK_TIMEOUT = "1s"
# How long the start-up round trip through the listener may take before we poll.
_NOTIFY_PROBE_SECONDS = 2.0


def _prepare_threshold(using: str) -> int | None:
    options = connections[using].settings_dict.get("OPTIONS", {})
    if conf.get("TRANSACTION_POOLING"):
        return None  # a transaction pooler hands each transaction to any server connection
    # Django leaves server-side prepared statements off by default; the worker repeats
    # a handful of statements thousands of times, so it prepares them unless told not to.
    return options.get("prepare_threshold", 5)


def keepalives(lease: float) -> dict[str, int]:
    """libpq settings that make a silently dead TCP link fail within about one lease."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, round(lease / 3)),
        "keepalives_interval": max(1, round(lease / 10)),
        "keepalives_count": 3,
        # Unacknowledged data (a statement sent into a partition) gives up after a lease.
        "tcp_user_timeout": max(1000, round(lease * 1000)),
        "connect_timeout": max(2, round(lease / 3)),
    }


def connect(using: str, purpose: str) -> psycopg.Connection[Any]:
    """Open an autocommit psycopg connection to the queue database, leaving no session state behind."""
    wrapper = connections[using]
    params = wrapper.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    params["prepare_threshold"] = _prepare_threshold(using)
    for key, value in keepalives(float(conf.get("LEASE_SECONDS"))).items():
        params.setdefault(key, value)  # the project's OPTIONS win
    params.setdefault("application_name", f"axa_django {purpose}")
    return psycopg.connect(autocommit=True, **params)


def task_backend_aliases() -> list[str]:
    """settings.TASKS aliases whose backend is axa_django's QueueBackend (none before Django 6.0)."""
    if django.VERSION < (6, 0):
        return []
    # Lazy: backends imports django.tasks, which exists only on Django >= 6.
    from .backends import queue_backend_aliases

    return queue_backend_aliases()


class NotMigrated(RuntimeError):
    """The database has no queue tables yet."""


class CannotConnect(ImproperlyConfigured):
    """The database refused the worker's first connection: wrong credentials or no such database."""


class PoolerMisconfigured(ImproperlyConfigured):
    """The database is reached through a transaction pooler the worker is not configured for."""


class Worker:
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
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be a positive whole number, not {concurrency!r}")
        if poll_interval is not None and not (isinstance(poll_interval, int | float) and poll_interval > 0):
            raise ValueError(f"poll_interval must be a positive number of seconds, not {poll_interval!r}")
        if max_jobs is not None and (type(max_jobs) is not int or max_jobs < 1):
            raise ValueError(f"max_jobs must be a positive whole number, not {max_jobs!r}")
        if grace_period is not None and not (isinstance(grace_period, int | float) and grace_period >= 0):
            raise ValueError(f"grace_period must be a number of seconds >= 0, not {grace_period!r}")
        self.id = uuid.uuid4()
        self.concurrency = concurrency
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
        self._conn: psycopg.Connection[Any] | None = None
        self._threads: list[threading.Thread] = []
        self._signals = 0
        self._statements: dict[tuple[str, tuple[str, ...]], str] = {}
        # The first look waits a lease: workers started together have all registered by then.
        self._next_unhandled = time.monotonic() + self.lease

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
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> int:
        names = self.handler_names()
        self._conn = self._first_connection()
        if self._conn is None:
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
        self._start_threads()
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
            if self.max_jobs is not None and claimed_total >= self.max_jobs and not self._in_flight:
                break
            idle = self._idle(claimed_total)
            if idle <= 0:
                self._wake.clear()
                if self._idle(claimed_total) <= 0:  # still no room after clearing
                    self._wait(next_housekeeping - time.monotonic())
                continue
            if backlog and idle < self.concurrency:
                # More rows are waiting and other threads are about to free up: wait
                # a moment for them, so that one claim serves several.
                idle = self._gather(claimed_total)
            # Read before claiming: an outcome written after the claim (a retry
            # queued again) must get another claim before a burst worker exits.
            settled = not self._in_flight and not self._unwritten
            self._wake.clear()
            jobs = self._claim(names, idle)
            if jobs is None:  # database trouble: already logged and backed off
                continue
            claimed_total += len(jobs)
            backlog = len(jobs) == idle
            for job in jobs:
                self._work.put(job)
            if len(jobs) < idle:
                if self.burst and not jobs:
                    if settled:
                        break
                    self._wait(next_housekeeping - time.monotonic())
                    continue
                if not jobs:
                    self._wait(min(self._next_run(names), next_housekeeping - time.monotonic()))

    def _idle(self, claimed_total: int) -> int:
        idle = self.concurrency - len(self._in_flight)
        if self.max_jobs is not None:
            idle = min(idle, self.max_jobs - claimed_total)
        return idle

    def _gather(self, claimed_total: int) -> int:
        deadline = time.monotonic() + _COALESCE
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
        self._wake.wait(max(0.0, min(timeout, self.poll_interval)))

    # -- database steps ----------------------------------------------------------

    def _first_connection(self) -> psycopg.Connection[Any] | None:
        """Connect the dispatcher, waiting for a server that is not up yet; CannotConnect if it refuses us."""
        delay = 0.1
        settings = connections[self.using].settings_dict
        where = f"database {settings.get('NAME')!r} on {settings.get('HOST') or 'local socket'}"
        if settings.get("PORT"):
            where += f":{settings['PORT']}"
        while not self._stopping.is_set():
            try:
                return connect(self.using, "dispatcher")
            except psycopg.OperationalError as error:
                if dberrors.refused(error):
                    raise CannotConnect(
                        f"cannot connect to {where} as {settings.get('USER') or 'the default user'!r} "
                        f"(DATABASES[{self.using!r}]): {dberrors.message(error)}"
                    ) from None
                # A process manager may start workers before PostgreSQL: wait for it.
                logger.warning(
                    "cannot reach %s yet (%s); the worker has not started and retries in %.1fs until the "
                    "database accepts it (SIGTERM stops it)",
                    where,
                    dberrors.message(error),
                    delay,
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, _RECONNECT_MAX)
        return None

    def _reconnect_until_ready(self, purpose: str) -> psycopg.Connection[Any] | None:
        delay = 0.1
        while not self._aborting.is_set():
            try:
                return connect(self.using, purpose)
            except psycopg.OperationalError as error:
                if self._stopping.is_set() and not self._in_flight:
                    return None
                logger.warning("%s: cannot reach the database (%s); retrying in %.1fs", purpose, error, delay)
                self._aborting.wait(delay)
                delay = min(delay * 2, _RECONNECT_MAX)
        return None

    def _execute(self, query: str, params: dict[str, Any], *, bounded: bool = False) -> list[tuple[Any, ...]] | None:
        """Run one dispatcher statement; on failure log, back off, return None.

        ``bounded`` runs it under a statement and lock timeout (housekeeping). A
        connection failure reconnects; any other database error is logged, and if
        the dispatcher's statements keep failing for a lease the worker stops (exit 1).
        """
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._reconnect_until_ready("dispatcher")
                if self._conn is None:
                    return None
            with contextlib.ExitStack() as stack:
                if bounded:
                    stack.enter_context(self._conn.transaction())
                cursor = stack.enter_context(self._conn.cursor())
                if bounded:
                    cursor.execute(sql.TIMEOUTS, {"statement": _STATEMENT_TIMEOUT, "lock": _LOCK_TIMEOUT})
                cursor.execute(query, params)
                rows = cursor.fetchall() if cursor.description else []
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            if isinstance(error, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
                logger.warning("dispatcher statement cut short (%s); trying again later", error)
                return None
            logger.warning("dispatcher lost the database (%s); reconnecting", error)
            self._close(self._conn)
            self._conn = None
            self._aborting.wait(0.2)
            return None
        except psycopg.Error as error:
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            logger.error("dispatcher statement failed (%s: %s); trying again shortly", type(error).__name__, error)
            if now - self._failing_since > self.lease:
                raise RuntimeError(f"the dispatcher's statements have failed for over {self.lease:g}s") from error
            self._aborting.wait(min(1.0, self.poll_interval))
            return None
        self._failing_since = None
        return rows

    def _check_tables(self) -> None:
        rows = self._execute("SELECT to_regclass('axa_queue') IS NULL OR to_regclass('axa_worker') IS NULL", {})
        if rows and rows[0][0]:
            self._close(self._conn)
            name = connections[self.using].settings_dict.get("NAME")
            raise NotMigrated(f"the queue tables do not exist in database {name!r}: run python manage.py migrate first")

    def _check_pooler(self) -> None:
        """Refuse, or fall back from, what a transaction pooler (PgBouncer) breaks.

        Two connections of one process served by the same server backend can only
        mean a pooler handing out backends per transaction: prepared statements and
        LISTEN then land on whichever backend the pooler picked.
        """
        if self.pooling:
            return
        try:
            probe = connect(self.using, "probe")
        except psycopg.OperationalError:
            return
        shared = False
        try:
            for _ in range(3):
                mine = self._execute("SELECT pg_backend_pid()", {})
                theirs = probe.execute("SELECT pg_backend_pid()").fetchone()
                if mine and theirs and mine[0][0] == theirs[0]:
                    shared = True
                    break
        except psycopg.Error:
            pass
        finally:
            self._close(probe)
        if not shared:
            return
        alias = self.using
        if _prepare_threshold(alias) is not None:
            self._close(self._conn)
            raise PoolerMisconfigured(
                f"database {alias!r} is reached through a pooler in transaction mode (PgBouncer's pool_mode = "
                "transaction): two of this worker's connections were served by one PostgreSQL backend. There the "
                "worker's prepared statements fail and jobs run twice, so it stops before claiming any. Set "
                "AXA_DJANGO['TRANSACTION_POOLING'] = True (no prepared statements, no LISTEN), or connect the "
                "worker to PostgreSQL directly or through a session-mode pool."
            )
        if self.notify:
            logger.warning(
                "database %r is reached through a pooler in transaction mode (PgBouncer?), where LISTEN/NOTIFY "
                "does not work: polling every %.1fs instead. Set AXA_DJANGO['TRANSACTION_POOLING'] = True "
                "(or 'NOTIFY': False) to say so and silence this warning.",
                alias,
                self.poll_interval,
            )
            self.notify = False

    def _check_notify(self) -> None:
        """Send ourselves a notification; if the listener never hears it, poll instead."""
        if not self._listening.wait(_NOTIFY_PROBE_SECONDS):
            return  # the listener is still connecting; it wakes us once it listens
        self._execute("SELECT pg_notify(%(channel)s, %(payload)s)", {"channel": CHANNEL, "payload": self._probe})
        if self._probe_seen.wait(_NOTIFY_PROBE_SECONDS):
            return
        logger.warning(
            "the listener did not receive this worker's own NOTIFY within %.0fs: LISTEN/NOTIFY does not reach this "
            "worker (PgBouncer in transaction mode?). Polling every %.1fs instead; set AXA_DJANGO['NOTIFY'] = "
            "False, or 'TRANSACTION_POOLING': True behind a transaction pooler.",
            _NOTIFY_PROBE_SECONDS,
            self.poll_interval,
        )
        self.notify = False

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
        params = {"lease": self.lease, "stale": self.stale_minutes, "max_attempts": int(conf.get("MAX_ATTEMPTS"))}
        rows = self._execute(sql.RESCUE, params, bounded=True)
        if rows:
            failed = sum(1 for _, status in rows if status == "failed")
            logger.warning(
                "requeued %d job(s) whose worker stopped; %d more had no attempts left and failed",
                len(rows) - failed,
                failed,
            )
        rows = self._execute(sql.FAIL_NEVER_DUE, {}, bounded=True)
        if rows:
            logger.warning("failed %d job(s) whose run_at was 'infinity'", len(rows))

    def _housekeep(self) -> float:
        """Rescue, then periodic jobs and pruning; return seconds until the next housekeeping."""
        interval = self._housekeeping_interval()
        self._rescue()
        if time.monotonic() >= self._next_unhandled:
            self._next_unhandled = time.monotonic() + unhandled.CHECK_SECONDS
            rows = self._execute(sql.UNHANDLED, unhandled.params(self.lease), bounded=True)
            unhandled.warn(unhandled.rows_to_unhandled(rows or []))
        soonest = housekeeping.run(self)
        if soonest is not None:
            interval = max(0.01, min(interval, soonest))
        return interval

    def _claim(self, names: list[str], limit: int) -> list[Claimed] | None:
        if not names and not self.backends:
            return []
        rows = self._execute(self._composed(sql.CLAIM, names), {"worker": self.id, "limit": limit})
        if rows is None:
            return None
        jobs = [
            Claimed(job_id, name, None, attempt, max_attempts, backend, args_json=args)
            for job_id, name, args, attempt, max_attempts, backend, _ in rows
        ]
        with self._lock:
            for job in jobs:
                function = registry.get(job.name) if job.backend is None else None
                # A task row may be async; its context lets a cancel reach it.
                if job.backend is not None or (function is not None and (function.takes_context or function.is_async)):
                    job.context = JobContext(job.id, job.name, job.attempt, self.id)
                self._in_flight[job.id] = job
        return jobs

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
            return self.poll_interval
        return float(rows[0][0])

    # -- threads -----------------------------------------------------------------

    def _start_threads(self) -> None:
        for index in range(self.concurrency):
            self._spawn(self._job_loop, f"axa-job-{index}")
        self._spawn(self._finish_loop, "axa-finisher")
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

    def _job_loop(self) -> None:
        try:
            while (job := self._work.get()) is not None:
                runner, function = None, None
                started = time.monotonic()
                try:
                    runner, function, outcome = self._perform(job)
                except BaseException as error:
                    logger.exception("running job %s %s failed outside the job", job.name, job.id)
                    outcome = failure(job, None, error, self.id)
                if self.log_attempts:
                    seconds = time.monotonic() - started
                    status, delay = outcome.status, outcome.delay
                    attempt_line(job.name, job.id, job.attempt, job.max_attempts, seconds, status, delay)
                with self._lock:
                    self._unwritten += 1
                self._outcomes.put(outcome)
                try:
                    send_finished(function, outcome, robust=True)
                    if runner is not None:
                        runner.finished(outcome)
                except Exception:
                    logger.exception("a finished signal of job %s %s raised", job.name, job.id)
                with self._lock:
                    self._in_flight.pop(job.id, None)
                    self.processed += 1
                    self.outcomes[outcome.status] += 1
                self._wake.set()
        finally:
            connections.close_all()

    def _perform(self, job: Claimed) -> tuple[Any, Any, Outcome]:
        runner, resolve = None, None
        if job.backend is not None:  # a django.tasks row; taskrunner imports django.tasks (Django >= 6)
            from .taskrunner import resolver

            runner, resolve = resolver(job)
        function = registry.get(job.name) if runner is None else None
        responses = job_started.send_robust(sender=function, job_id=job.id, name=job.name, attempt=job.attempt)
        log_receiver_errors("job_started", responses)
        outcome = perform(job, self.id, resolve or (lambda _job: function))
        aliases = release_connections()
        if aliases:
            outcome = leaked(job, runner or function, outcome, aliases, self.id)
        return runner, function, outcome

    def _heartbeat_loop(self) -> None:
        """Refresh this worker's lease every lease/3 on a connection of its own, whatever else is busy."""
        conn: psycopg.Connection[Any] | None = None
        interval = self._housekeeping_interval()
        timeout = f"{max(100, round(interval * 1000))}ms"
        while not self._done.wait(interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.using, "heartbeat")
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.execute(sql.TIMEOUTS, {"statement": timeout, "lock": timeout})
                    cursor.execute(sql.HEARTBEAT, {"worker": self.id})
                    alive, cancelled, _ = cursor.fetchone() or (1, [], None)
                    if not alive:
                        # Our row was taken for dead (we were cut off past the lease): rejoin.
                        logger.warning("worker %s was presumed dead; registering again", self.id)
                        cursor.execute(sql.REGISTER, self._registration())
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                if not isinstance(error, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
                    self._close(conn)
                    conn = None
                logger.warning("heartbeat failed (%s); trying again in %.1fs", error, interval)
                continue
            except psycopg.Error as error:
                logger.error("heartbeat failed (%s: %s); trying again in %.1fs", type(error).__name__, error, interval)
                continue
            with self._lock:
                for job_id in cancelled:
                    job = self._in_flight.get(job_id)
                    if job is not None and job.context is not None:
                        job.context.cancel()
        self._close(conn)

    def _finish_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        with contextlib.suppress(psycopg.OperationalError):
            conn = connect(self.using, "finisher")  # now, so the first outcome does not wait for it
        done = False
        while not done:
            first = self._outcomes.get()
            if first is None:
                break
            batch = [first]
            gather_until = time.monotonic() + _COALESCE
            while len(batch) < 500:
                try:
                    # Outcomes of jobs claimed together arrive together: a moment's
                    # wait lets one statement write them all.
                    item = self._outcomes.get(timeout=max(0.0, gather_until - time.monotonic()))
                except queue_module.Empty:
                    break
                if item is None:
                    done = True
                    break
                batch.append(item)
            conn, written = self._write(conn, batch)
            for outcome in batch:
                if outcome.id not in written and not self._aborting.is_set():
                    logger.warning(
                        "outcome of job %s %s not written: the job was rescued or changed meanwhile",
                        outcome.name,
                        outcome.id,
                    )
            with self._lock:
                self._unwritten -= len(batch)
            self._wake.set()
        self._close(conn)

    def _write(
        self, conn: psycopg.Connection[Any] | None, batch: list[Outcome]
    ) -> tuple[psycopg.Connection[Any] | None, set[uuid.UUID]]:
        """Write a batch of outcomes, through outages; an outcome the database refuses is written as a failure."""
        delay = 0.1
        while True:
            try:
                if conn is None or conn.closed:
                    conn = connect(self.using, "finisher")
                try:
                    with conn.cursor() as cursor:
                        return conn, finish(cursor, batch, self.id)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    raise
                except psycopg.Error as error:
                    if len(batch) > 1:  # find the one the database refuses; write the others as they are
                        written: set[uuid.UUID] = set()
                        for outcome in batch:
                            conn, ids = self._write(conn, [outcome])
                            written |= ids
                        return conn, written
                    with conn.cursor() as cursor:
                        return conn, finish(cursor, [unstorable(batch[0], error)], self.id)
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                if self._aborting.is_set():
                    return conn, set()
                logger.warning("cannot write %d outcome(s) (%s); retrying in %.1fs", len(batch), error, delay)
                self._close(conn)
                conn = None
                self._aborting.wait(delay)
                delay = min(delay * 2, _RECONNECT_MAX)

    def _listen_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        delay = 0.1
        while not self._stopping.is_set() and self.notify:
            try:
                if conn is None or conn.closed:
                    conn = connect(self.using, "listener")
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {housekeeping.CANCEL_CHANNEL}")
                    self._listening.set()
                    self._wake.set()  # anything enqueued while we were deaf
                    delay = 0.1
                for note in conn.notifies(timeout=0.5):
                    if self._stopping.is_set():
                        break  # shutdown sends a notification to get us here at once
                    if note.payload == self._probe:
                        self._probe_seen.set()
                        continue
                    if note.channel == housekeeping.CANCEL_CHANNEL:
                        housekeeping.relay_cancel(self._lock, self._in_flight, note.payload)
                    self._wake.set()
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                logger.warning("listener lost the database (%s); reconnecting in %.1fs", error, delay)
                self._close(conn)
                conn = None
                self._stopping.wait(delay)
                delay = min(delay * 2, _RECONNECT_MAX)
        if conn is not None and not self.notify:
            # Given up for polling (a transaction pooler?): leave no LISTEN on a pooled backend.
            with contextlib.suppress(psycopg.Error):
                conn.execute("UNLISTEN *")
        self._close(conn)

    # -- shutdown ----------------------------------------------------------------

    def _shutdown(self) -> int:
        self._stopping.set()
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
            waits = thread.name in ("axa-finisher", "axa-listener") or not self._aborting.is_set()
            if waits and thread.name != "axa-heartbeat":
                thread.join(timeout=None if not self._aborting.is_set() else 5)
        self._execute(sql.UNREGISTER, {"worker": self.id})
        self._done.set()
        self._close(self._conn)
        if self._fatal is not None:
            logger.critical("worker %s stopped because its %s thread died", self.id, self._fatal)
            return 1
        logger.info("worker %s stopped after %s", self.id, summary(self.processed, self.outcomes))
        return 1 if self._aborting.is_set() else 0

    @staticmethod
    def _close(conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def unstorable(outcome: Outcome, error: psycopg.Error) -> Outcome:
    """``outcome`` stripped to what can always be stored, saying why the rest was not."""
    reason = storable(f"{type(error).__name__}: {error}")
    text = f"the outcome of this attempt ({outcome.status}) could not be stored: {reason}"
    entry = json.dumps(
        {
            "attempt": outcome.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "type": "axa_django.execution.UnstorableOutcome",
            "message": text,
            "traceback": "",
        }
    )
    status = "failed" if outcome.status == "completed" else outcome.status
    return Outcome(outcome.id, outcome.name, outcome.attempt, status, error=text, entry=entry, delay=outcome.delay)
