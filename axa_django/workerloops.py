"""The worker's threads: job loops, the heartbeat, the finisher that writes outcomes, the listener.

``Loops`` is the part of ``Worker`` that runs on its threads; each loop holds a
connection of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue as queue_module
import time
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg
from django.db import connections

from . import health, registry, sql
from .context import JobCancelled
from .exceptions import UnstorableOutcome, stored_type
from .execution import (
    Claimed,
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
from .logs import attempt_line
from .signals import job_started
from .workerdb import CANCEL_CHANNEL, CHANNEL, COALESCE, RECONNECT_MAX, connect

logger = logging.getLogger("axa_django")


class Loops:
    """The thread bodies of ``Worker`` (a mixin: the attributes are the worker's)."""

    health_file: str | None

    def _job_loop(self) -> None:
        try:
            while (job := self._work.get()) is not None:
                runner, function = None, None
                started = time.monotonic()
                if job.unmarked:
                    job_start = time.time()
                    with self._lock:
                        self._starts[job.id] = job_start
                try:
                    if job.context is not None and job.context.is_cancelled():
                        # Cancelled while claimed ahead, before any thread took it.
                        outcome = failure(job, None, JobCancelled("cancelled before it started"), self.id)
                    else:
                        runner, function, outcome = self._perform(job)
                except BaseException as error:
                    logger.exception("running job %s %s failed outside the job", job.name, job.id)
                    outcome = failure(job, None, error, self.id)
                if job.watch is not None and not job.watch.settle():
                    # Given up at its timeout, outcome written, a new thread in its place.
                    logger.warning("job %s %s returned after it was given up; its outcome is dropped", job.name, job.id)
                    return
                seconds = time.monotonic() - started
                average = self._job_seconds
                # A benign race between threads: the average only sizes the claim-ahead.
                self._job_seconds = seconds if average is None else 0.8 * average + 0.2 * seconds
                if job.unmarked:
                    outcome.started = job_start
                    with self._lock:
                        self._starts.pop(job.id, None)  # the outcome writes it
                if self.log_attempts:
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
        self._touch_health_file()  # the worker has just registered
        while not self._done.wait(interval):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.using, "heartbeat")
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.execute(sql.TIMEOUTS, {"statement": timeout, "lock": timeout})
                    with self._lock:
                        ids = list(self._in_flight)
                    cursor.execute(sql.HEARTBEAT, {"worker": self.id, "ids": ids})
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
            self._touch_health_file()
            self._cancel(cancelled)
        self._close(conn)

    def _cancel(self, job_ids: Iterable[uuid.UUID]) -> None:
        """Tell those of our running jobs that were cancelled (flagged in their rows, or notified)."""
        with self._lock:
            for job_id in job_ids:
                job = self._in_flight.get(job_id)
                if job is not None and job.context is not None:
                    job.context.cancel()

    def _touch_health_file(self) -> None:
        try:
            health.touch(self.health_file)
        except OSError as error:
            logger.warning("cannot touch the health file %s (%s); jobs still run", self.health_file, error)

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
            gather_until = time.monotonic() + COALESCE
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
            self._wake_limited(conn, batch)
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
                delay = min(delay * 2, RECONNECT_MAX)

    def _listen_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        delay = 0.1
        while not self._stopping.is_set() and self.notify:
            try:
                if conn is None or conn.closed:
                    conn = connect(self.using, "listener")
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                    self._listening.set()
                    self._wake.set()  # anything enqueued while we were deaf
                    self._lanes.lower(None)  # and rows made ready behind the floors meanwhile
                    delay = 0.1
                for note in conn.notifies(timeout=0.5):
                    if self._stopping.is_set():
                        break  # shutdown sends a notification to get us here at once
                    if note.payload == self._probe:
                        self._probe_seen.set()
                        continue
                    if note.channel == CANCEL_CHANNEL:
                        with contextlib.suppress(ValueError):  # a payload not ours
                            self._cancel([uuid.UUID(note.payload)])
                    else:
                        if note.payload:
                            self._lanes.heard(note.payload)  # rows ready behind the claim's floors
                        self._stir()  # rows enqueued, or slots freed on another worker
                    self._wake.set()
            except (psycopg.OperationalError, psycopg.InterfaceError) as error:
                logger.warning("listener lost the database (%s); reconnecting in %.1fs", error, delay)
                self._close(conn)
                conn = None
                self._stopping.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        if conn is not None and not self.notify:
            # Given up for polling (a transaction pooler?): leave no LISTEN on a pooled backend.
            with contextlib.suppress(psycopg.Error):
                conn.execute("UNLISTEN *")
        self._close(conn)

    # -- shutdown ----------------------------------------------------------------


def unstorable(outcome: Outcome, error: psycopg.Error) -> Outcome:
    """``outcome`` stripped to what can always be stored, saying why the rest was not."""
    reason = storable(f"{type(error).__name__}: {error}")
    text = f"the outcome of this attempt ({outcome.status}) could not be stored: {reason}"
    entry = json.dumps(
        {
            "attempt": outcome.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "type": stored_type(UnstorableOutcome),
            "message": text,
            "traceback": "",
        }
    )
    status = "failed" if outcome.status == "completed" else outcome.status
    return Outcome(outcome.id, outcome.name, outcome.attempt, status, error=text, entry=entry, delay=outcome.delay)
