"""The job threads: each takes a claimed job, runs its attempt, and hands the outcome to the finisher."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from django.db import connections

from .. import registry
from ..context import JobCancelled
from ..execution import (
    Claimed,
    Outcome,
    failure,
    leaked,
    log_receiver_errors,
    perform,
    release_connections,
    send_finished,
)
from ..execution.dberrors import check_connections
from ..signals import job_started
from .connection import opened
from .control import Control
from .ledger import Ledger
from .logs import attempt_line
from .options import Options

logger = logging.getLogger("axa_django")


class JobThreads:
    """``concurrency`` threads that run attempts; ``replace`` adds one in place of a stuck thread."""

    def __init__(self, options: Options, worker_id: uuid.UUID, control: Control, ledger: Ledger) -> None:
        self.options, self.worker_id, self.control, self.ledger = options, worker_id, control, ledger
        self._replacements = 0
        self._threads: list[threading.Thread] = []
        # Attempts lost to the database: with the worker's connections opened (each reconnect
        # after an outage opens one), the outages the job threads have seen (``generation``).
        self._losses = 0

    def generation(self) -> int:
        """A number that changes whenever the worker sees an outage: a reconnect, an attempt lost to the database."""
        return opened() + self._losses

    def start(self) -> None:
        """Start the job threads."""
        for index in range(self.options.concurrency):
            self._spawn(f"axa-job-{index}")

    def replace(self) -> None:
        """Start one more job thread, in place of one given up at a timeout."""
        self._replacements += 1
        self._spawn(f"axa-job-r{self._replacements}")

    def _spawn(self, name: str) -> None:
        # One thread's death stops the worker as a first signal does: the other threads'
        # jobs need none of it, and given back while those threads ran them, another
        # worker started them again at once (review).
        self._threads.append(self.control.spawn(self.loop, name, needed=False))

    def alive(self) -> bool:
        """Whether a job thread is left to run a job handed out (one given up at its timeout is not)."""
        return any(thread.is_alive() and not self.ledger.is_stuck(thread) for thread in self._threads)

    def stop(self) -> None:
        """Let each job thread end once the jobs handed out before are done."""
        for _ in range(self.options.concurrency):
            self.ledger.work.put(None)

    def loop(self) -> None:
        """Run jobs from the ledger until handed None (or this thread's job is given up)."""
        ledger = self.ledger
        seen = self.generation()
        try:
            while True:
                ledger.await_written(self.control.aborting)
                job = ledger.work.get()
                if job is None:
                    break
                if self.generation() != seen:
                    # An outage since this thread's last job: its connections may be dead.
                    seen = self.generation()
                    check_connections()
                runner, function = None, None
                started = time.monotonic()
                job_start = ledger.started(job)
                try:
                    if job.context is not None and job.context.is_cancelled():
                        # Cancelled while claimed ahead, before any thread took it.
                        outcome = failure(job, None, JobCancelled("cancelled before it started"), self.worker_id)
                    else:
                        runner, function, outcome = self.perform(job)
                except BaseException as error:
                    logger.exception("running job %s %s failed outside the job", job.name, job.id)
                    outcome = failure(job, None, error, self.worker_id)
                if job.watch is not None and not job.watch.settle():
                    # Given up at its timeout, outcome written, a new thread in its place.
                    logger.warning("job %s %s returned after it was given up; its outcome is dropped", job.name, job.id)
                    return
                seconds = time.monotonic() - started
                ledger.timed(seconds)
                ledger.finished(job, outcome, started=job_start)
                try:
                    if outcome.lost is not None:
                        self._lost(job, outcome)
                    if self.options.log_attempts:
                        status, delay = outcome.status, outcome.delay
                        attempt_line(job.name, job.id, job.attempt, job.max_attempts, seconds, status, delay)
                    try:
                        send_finished(function, outcome, robust=True)
                        if runner is not None:
                            runner.finished(outcome)
                    except Exception:
                        logger.exception("a finished signal of job %s %s raised", job.name, job.id)
                finally:
                    # Its outcome is the finisher's now, whatever ends this thread (a receiver's
                    # SystemExit): held on, a stop gave the job back and it ran again (review).
                    ledger.release(job, outcome)
                self.control.rouse()
        finally:
            connections.close_all()

    def _lost(self, job: Claimed, outcome: Outcome) -> None:
        """An attempt lost to the database: once written, say whether it is queued again or failed the job.

        FINISH decides (max_losses reached: failed) and the finisher sets the outcome's
        status: the lines, the signals and the counts then say what became of the job.
        """
        self._losses += 1  # the other threads' connections may have died too
        self.ledger.await_outcome(outcome.id, self.control.aborting)
        what = json.loads(outcome.entry or "{}").get("message") or "its database connection was lost"
        if outcome.status == "failed":
            logger.error(
                "job %s %s failed: %s, one loss more than max_losses allows; if the job ends its own connection "
                "(pg_terminate_backend, a timeout that ends sessions), fix that, then retry it",
                job.name,
                job.id,
                what,
            )
        elif outcome.status == "cancelled":  # its cancel was asked: the requeue guard ended it
            logger.warning("job %s %s: %s; it was cancelled, not queued again", job.name, job.id, what)
        elif self.ledger.unwritten_outcome(outcome.id):
            if self.control.stopping.is_set():  # the stop's grace period ran out before the write
                logger.warning(
                    "job %s %s: %s; its outcome could not be written before the stop, so the row stays running "
                    "under this worker until the rescue queues it again",
                    job.name,
                    job.id,
                    what,
                )
            else:  # the finisher said why (rescued or changed meanwhile, or refused)
                logger.warning("job %s %s: %s; its outcome was not written", job.name, job.id, what)
        else:
            logger.warning(
                "job %s %s: %s; it is queued again without using an attempt (a loss is counted: max_losses "
                "bounds them)",
                job.name,
                job.id,
                what,
            )

    def perform(self, job: Claimed) -> tuple[Any, Any, Outcome]:
        """Run one attempt of ``job`` here; return its task runner (django.tasks rows), its function and outcome."""
        runner, resolve = None, None
        if job.backend is not None:  # a django.tasks row; taskrunner imports django.tasks (Django >= 6)
            from ..execution.taskrunner import resolver

            runner, resolve = resolver(job)
        function = registry.get(job.name) if runner is None else None
        if job_started.receivers:
            responses = job_started.send_robust(sender=function, job_id=job.id, name=job.name, attempt=job.attempt)
            log_receiver_errors("job_started", responses)
        outcome = perform(job, self.worker_id, resolve or (lambda _job: function))
        aliases = release_connections()
        if aliases:
            outcome = leaked(job, runner or function, outcome, aliases, self.worker_id)
        return runner, function, outcome
