"""Every exception a job's row can store or a caller can catch, defined once.

A failed attempt stores its exception's class path in the row (``errors[].type``:
``axa_django.exceptions.<Name>`` for these), and django.tasks reads it back with
``import_string``: a class here must never move or be renamed. The modules that
raised them before keep them importable under their old names.
"""

from __future__ import annotations

from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.db.utils import ProgrammingError

__all__ = [
    "ArgumentsMismatch",
    "BadResult",
    "BadRow",
    "CannotConnect",
    "DuplicateJob",
    "HistoryRefused",
    "JobCancelled",
    "JobLost",
    "JobTimeout",
    "LeakedTransaction",
    "NoHandler",
    "NotATask",
    "NotMigrated",
    "PoolerMisconfigured",
    "QueueTableMissing",
    "TaskRefused",
    "UnknownJobWarning",
    "UnknownJobs",
    "UnknownQueueWarning",
    "UnknownQueues",
    "UnreachableJobWarning",
    "UnstorableOutcome",
    "WorkerInterrupted",
    "WorkerLost",
    "stored_type",
]


def stored_type(kind: type[BaseException]) -> str:
    """The path an attempt's error entry stores for ``kind`` (``import_string`` gives ``kind`` back)."""
    return f"{kind.__module__}.{kind.__qualname__}"


# -- raised in a job's attempt, stored in its row ---------------------------------------


class JobTimeout(BaseException):
    """An attempt ran past its ``timeout``: raised in the job's thread, or its task cancelled.

    A BaseException, as asyncio.CancelledError is, so that a job's ``except Exception``
    does not swallow it; the attempt fails with it (and is retried per max_attempts).
    """


class JobLost(Exception):
    """complete_in_transaction() found that this attempt no longer owns its row: its transaction rolls back."""


class JobCancelled(Exception):
    """Raise from a job to end it as ``cancelled``; an async job stopped by ``cancel()`` ends with it."""


class NoHandler(LookupError):
    """No job of this name is registered in the worker."""


class TaskRefused(NoHandler):
    """The row names no Task of a QueueBackend; it fails at once and nothing is called."""


class ArgumentsMismatch(TypeError):
    """A row's args do not fit its job's signature; running it again cannot help."""


class BadResult(TypeError):
    """The job returned something that is not JSON."""


class BadRow(ValueError):
    """The row holds values this worker cannot decode (args nested too deeply, huge numbers)."""


class LeakedTransaction(RuntimeError):
    """The job returned with a transaction still open on one of its connections."""


class UnstorableOutcome(Exception):
    """The attempt's outcome (its result or error) could not be written to its row; only why was stored."""


class HistoryRefused(Exception):
    """The database refused to move the finished job into the history (a user's foreign key or trigger):
    the job was finished in place, in axa_queue."""


class WorkerLost(Exception):
    """The worker running the job stopped (no heartbeat); the job was queued again or, past max_losses, failed."""


class WorkerInterrupted(Exception):
    """The worker was stopped before the job finished; the job was queued again."""


class NotATask(LookupError):
    """A row's task path does not name a Task of a QueueBackend; the worker will not call it."""


# -- raised to a caller -----------------------------------------------------------------


class _HeldRow(Protocol):
    id: Any
    name: str
    unique_key: str | None
    status: str


class DuplicateJob(Exception):
    """A job with this name and unique key is already queued or running."""

    def __init__(self, job: _HeldRow) -> None:
        super().__init__(f"job {job.name!r} with unique key {job.unique_key!r} is already {job.status} ({job.id})")
        self.job = job


class UnknownJobs(ValueError):
    """A worker was asked for job names that no registered job has."""


class UnknownQueues(ValueError):
    """A worker was asked for queues nothing knows: no job declares them and no queued row is in them."""


class NotMigrated(RuntimeError):
    """The database has no queue tables yet."""


class QueueTableMissing(ProgrammingError):
    """An enqueue found no queue table: the database is not migrated. A ProgrammingError, as the
    database's own error was, so that code catching that still catches this; chained from it."""


class CannotConnect(ImproperlyConfigured):
    """The database refused the worker's first connection: wrong credentials or no such database."""


class PoolerMisconfigured(ImproperlyConfigured):
    """The database is reached through a transaction pooler the worker is not configured for."""


class UnreachableJobWarning(UserWarning):
    """A job defined in a module no worker imports at start, so no worker can run it."""


class UnknownJobWarning(UnreachableJobWarning):
    """A job enqueued by a name no job of this process is registered as: no worker of this project runs it.

    A subclass of UnreachableJobWarning: a filter that silences that one silences this too.
    """


class UnknownQueueWarning(UnreachableJobWarning):
    """A job enqueued into a queue this process knows nothing of: a worker started with --queue never takes it."""
