"""The worker's side of django.tasks rows: resolve a row's task path safely and run it.

Imported by the worker only for rows whose ``backend`` is set, so a project without a
tasks framework (Django 5.2 without the django-tasks backport) never loads it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from .. import conf
from ..arguments import ArgumentsMismatch
from ..backends import NotATask, QueueBackend, import_task, plain_json, queue_backend_aliases, rebuild_task
from ..backends.framework import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_finished,
    task_started,
)
from ..exceptions import JobCancelled, TaskRefused, stored_type
from ..registry import default_backoff
from . import Claimed, Outcome

# The row's args object is {"args": [...], "kwargs": {...}}; perform() binds it to this.
_CALL = inspect.Signature(
    [
        inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("kwargs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    ]
)


class TaskRunner:
    """What ``execution.perform`` runs for one claimed django.tasks row (a JobFunction look-alike)."""

    signature = _CALL
    takes_context = False
    is_async = False

    def __init__(self, job: Claimed, backend: QueueBackend | None, task: Task | None, refusal: str = "") -> None:
        self.job = job
        self.name = job.name
        self.backend = backend
        self.task = task
        self.refusal = refusal
        self.started: TaskResult | None = None

    @classmethod
    def for_row(cls, job: Claimed) -> TaskRunner:
        """Resolve a claimed row's task; never raises (a refused row fails when run)."""
        try:
            if job.backend not in queue_backend_aliases():
                raise NotATask(f"backend {job.backend!r} is not a QueueBackend alias in settings.TASKS")
            backend = task_backends[job.backend]
            task = rebuild_task(import_task(job.name), backend=job.backend)
        except NotATask as error:
            return cls(job, None, None, str(error))
        except BaseException as error:  # noqa: BLE001 - no row may stop the worker, whatever its import raises
            return cls(job, None, None, f"resolving task {job.name!r} raised {error!r}")
        return cls(job, backend, task)

    @property
    def attempts_allowed(self) -> int:
        """Attempts a row gets when it does not say: OPTIONS['MAX_ATTEMPTS'], else AXA_DJANGO's."""
        return (self.backend.max_attempts if self.backend else None) or conf.get("MAX_ATTEMPTS")

    def retry_delay(self, attempt: int) -> float:
        """Seconds before the next attempt: OPTIONS['BACKOFF'], else exponential."""
        if self.backend is not None and self.backend.backoff is not None:
            return self.backend.backoff
        return default_backoff(attempt)

    def func(self, args: Any = None, kwargs: Any = None) -> Any:
        """Send task_started, then call the task; an async task's coroutine goes back to the worker."""
        if self.task is None or self.backend is None:
            raise TaskRefused(f"refused to run {self.name!r}: {self.refusal}")
        args = [] if args is None else args
        kwargs = {} if kwargs is None else kwargs
        if type(args) is not list or type(kwargs) is not dict:
            raise ArgumentsMismatch('a task row\'s args must be {"args": [...], "kwargs": {...}}')
        self.started = self.backend._result(self.backend._row(self.job.id), self.task)
        task_started.send(type(self.backend), task_result=self.started)
        call_args = [TaskContext(task_result=self.started), *args] if self.task.takes_context else args
        try:
            inspect.signature(self.task.func).bind(*call_args, **kwargs)
        except TypeError as error:
            raise ArgumentsMismatch(f"the arguments do not fit task {self.task.module_path}: {error}") from None
        value = self.task.func(*call_args, **kwargs)
        if inspect.iscoroutine(value):
            return _normalized(value)
        return _normalize(value)

    def finished(self, outcome: Outcome) -> None:
        """Send task_finished once the task is done (not after an attempt that will be retried)."""
        if self.started is None or self.backend is None or outcome.status == "queued":
            return
        result = dataclasses.replace(self.started, finished_at=timezone.now(), errors=list(self.started.errors))
        if outcome.status == "completed":
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "_return_value", json.loads(outcome.result or "null"))
        else:
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            entry = json.loads(outcome.entry) if outcome.entry else {}
            path = entry.get("type") or stored_type(JobCancelled)
            result.errors.append(TaskError(exception_class_path=path, traceback=entry.get("traceback") or ""))
        task_finished.send(type(self.backend), task_result=result)


def _normalize(value: Any) -> Any:
    # Django's JSON rule (tuples become lists); what it refuses is left for the
    # worker's strict check, which fails the task with a clear message.
    try:
        return plain_json(value)
    except (TypeError, ValueError):
        return value


async def _normalized(coroutine: Any) -> Any:
    return _normalize(await coroutine)


def resolver(job: Claimed) -> tuple[TaskRunner, Callable[[Claimed], TaskRunner]]:
    """The runner for a claimed django.tasks row, and a resolver for ``execution.perform``."""
    runner = TaskRunner.for_row(job)
    return runner, lambda _job: runner
