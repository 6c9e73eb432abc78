"""What the worker says: counted words, the per-attempt line, and runworker's own log set-up."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping

logger = logging.getLogger("axa_django")
# One line per finished attempt (runworker -v 2): its own logger, so a project can route
# or silence it apart from the worker's other lines.
jobs_logger = logging.getLogger("axa_django.jobs")

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# A running worker says at INFO what its attempts came to, once a minute when any
# finished, and that it is alive every ten minutes when none did: at the default
# verbosity a healthy worker was silent from its start to its stop.
SUMMARY_SECONDS = 60.0
IDLE_SUMMARY_SECONDS = 600.0


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 handler``, ``2 handlers``; ``words`` for an irregular plural."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def summary(attempts: int, outcomes: Mapping[str, int]) -> str:
    """``3 attempts: 2 completed, 1 queued again after an error``: attempts, then what became of them."""
    # "queued": the attempt raised and the row went back to the queue; say what happened, promise nothing.
    words = {
        "completed": "completed",
        "failed": "failed",
        "cancelled": "cancelled",
        "queued": "queued again after an error",
    }
    parts = [f"{outcomes[status]} {word}" for status, word in words.items() if outcomes.get(status)]
    return plural(attempts, "attempt") + (": " + ", ".join(parts) if parts else "")


class Summary:
    """The periodic line: ``tick`` is called often (each heartbeat) and logs when one is due."""

    def __init__(self, worker_id: uuid.UUID, now: float | None = None) -> None:
        self.worker_id = worker_id
        self._since = self._said = time.monotonic() if now is None else now
        self._processed = 0
        self._counts: dict[str, int] = {}

    def tick(self, processed: int, counts: Mapping[str, int], running: int, now: float | None = None) -> str | None:
        """Log the line if one is due (``processed`` and ``counts``: since the start); return it."""
        now = time.monotonic() if now is None else now
        if now - self._since < SUMMARY_SECONDS:
            return None
        done = processed - self._processed
        line = None
        if done:
            since = {status: count - self._counts.get(status, 0) for status, count in counts.items()}
            line = f"worker {self.worker_id}: {summary(done, since)} in the last {now - self._since:.0f}s"
        elif now - self._said >= IDLE_SUMMARY_SECONDS:
            line = f"worker {self.worker_id}: no attempt finished in the last {now - self._said:.0f}s"
        self._since, self._processed, self._counts = now, processed, dict(counts)
        if line is None:
            return None
        self._said = now
        line += f"; {plural(running, 'job')} running"
        logger.info("%s", line)
        return line


def attempt_line(
    name: str, job_id: object, attempt: int, max_attempts: int | None, seconds: float, status: str, delay: float
) -> None:
    """Log one finished attempt on ``axa_django.jobs`` at INFO: ``failed in 0.004s, next attempt in 2.0s``."""
    of = f"/{max_attempts}" if max_attempts else ""
    if status == "queued":
        then = "at once" if delay <= 0 else f"in {delay:.1f}s"
        jobs_logger.info(
            "job %s %s attempt %d%s: failed in %.3fs, next attempt %s", name, job_id, attempt, of, seconds, then
        )
    else:
        jobs_logger.info("job %s %s attempt %d%s: %s in %.3fs", name, job_id, attempt, of, status, seconds)


def configured(name: str = "axa_django") -> bool:
    """Whether a handler would receive records of logger ``name`` (its own, or an ancestor's it propagates to).

    Django's default LOGGING configures only the ``django`` loggers, never the root
    or ``axa_django``, so under it this is False.
    """
    current: logging.Logger | None = logging.getLogger(name)
    while current is not None:
        if current.handlers:
            return True
        if not current.propagate:
            return False
        current = current.parent  # type: ignore[assignment]
    return False


def configure_for_command(verbosity: int) -> bool:
    """Give ``axa_django`` a stderr handler if the project configured none; return whether it did.

    Only the ``axa_django`` logger: the root (and so the project's own loggers, which
    a job may use) is left as the project set it, so no line is printed twice.
    """
    if verbosity < 1 or configured():
        return False
    target = logging.getLogger("axa_django")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    target.addHandler(handler)
    target.propagate = False  # the root has no handler either: nothing is lost
    if target.level == logging.NOTSET:
        target.setLevel(logging.DEBUG if verbosity >= 3 else logging.INFO)
    return True
