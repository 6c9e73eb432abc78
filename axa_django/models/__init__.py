"""The app's tables: ``jobs`` (axa_queue), ``workflows`` (groups, edges), ``queue`` (workers, pauses...)."""

from .jobs import (
    QUEUED,
    FailedJob,
    Job,
    JobQuerySet,
    OutOfRange,
    QueueDashboard,
    RetryResult,
    RowDateTimeField,
    RowJSONField,
    Undecodable,
)
from .names import JobNames, NameSpan, NameStat
from .queue import FinishedHour, QueueLimit, QueuePause, RateBucket, Schedule, Worker
from .workflows import Dependency, Workflow

__all__ = [
    "QUEUED",
    "Dependency",
    "FailedJob",
    "FinishedHour",
    "Job",
    "JobNames",
    "JobQuerySet",
    "NameSpan",
    "NameStat",
    "OutOfRange",
    "QueueDashboard",
    "QueueLimit",
    "QueuePause",
    "RateBucket",
    "RetryResult",
    "RowDateTimeField",
    "RowJSONField",
    "Schedule",
    "Undecodable",
    "Worker",
    "Workflow",
]
