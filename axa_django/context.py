"""JobContext: what a running job may ask about itself."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field


@dataclass
class JobContext:
    """Passed as the first argument to jobs declared with ``takes_context=True``."""

    job_id: uuid.UUID
    name: str
    attempt: int
    worker_id: uuid.UUID | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def is_cancelled(self) -> bool:
        """True once someone asked this job to stop (``job.cancel()`` on a running job)."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Mark this job as asked to stop; the worker calls this when it sees the request."""
        self._cancelled.set()
