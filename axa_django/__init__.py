"""axa-django: a PostgreSQL job queue for Django."""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from .context import JobContext
from .exceptions import (
    DuplicateJob,
    JobCancelled,
    JobLost,
    JobTimeout,
    UnknownJobWarning,
    UnknownQueueWarning,
    UnreachableJobWarning,
)

__all__ = [
    "DuplicateJob",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobLost",
    "JobTimeout",
    "UnknownJobWarning",
    "UnknownQueueWarning",
    "UnreachableJobWarning",
    "background_job",
    "batch",
    "enqueue",
    "enqueue_many",
    "workflow",
]
# pyproject.toml's version, the one place it is written (as the installed metadata says it).
__version__ = _metadata.version("axa-django")

if TYPE_CHECKING:
    from .models import Job
    from .registry import background_job, enqueue, enqueue_many
    from .workflows import batch, workflow


def __getattr__(name: str) -> Any:
    # Lazy, so that importing axa_django in settings.py does not load models early.
    if name == "Job":
        from .models import Job

        return Job
    if name in ("background_job", "enqueue", "enqueue_many"):
        from . import registry

        return getattr(registry, name)
    if name in ("batch", "workflow"):
        from . import workflows

        return getattr(workflows, name)
    if name == "DuplicateJob":
        return DuplicateJob
    raise AttributeError(f"module 'axa_django' has no attribute {name!r}")
