"""The job threads: each takes a claimed job, runs its attempt, and hands the outcome to the finisher."""

from __future__ import annotations

import logging
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
from ..signals import job_started
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

    def start(self) -> None:
        """Start the job threads."""
        for index in range(self.options.concurrency):
            self.control.spawn(self.loop, f"axa-job-{index}")

    def replace(self) -> None:
        """Start one more job thread, in place of one given up at a timeout."""
        self._replacements += 1
        self.control.spawn(self.loop, f"axa-job-r{self._replacements}")

    def stop(self) -> None:
        """Let each job thread end once the jobs handed out before are done."""
        for _ in range(self.options.concurrency):
            self.ledger.work.put(None)

    def loop(self) -> None:
        """Run jobs from the ledger until handed None (or this thread's job is given up)."""
        ledger = self.ledger
        try:
            while True:
                ledger.await_written(self.control.aborting)
                job = ledger.work.get()
                if job is None:
                    break
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
                if self.options.log_attempts:
                    status, delay = outcome.status, outcome.delay
                    attempt_line(job.name, job.id, job.attempt, job.max_attempts, seconds, status, delay)
                ledger.finished(job, outcome, started=job_start)
                try:
                    send_finished(function, outcome, robust=True)
                    if runner is not None:
                        runner.finished(outcome)
                except Exception:
                    logger.exception("a finished signal of job %s %s raised", job.name, job.id)
                ledger.release(job, outcome)
                self.control.rouse()
        finally:
            connections.close_all()

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
