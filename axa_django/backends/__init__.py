"""A tasks backend whose tasks are rows of axa_queue, run by runworker: Django's django.tasks
(Django >= 6.0) or the django-tasks backport on Django 5.2 (``framework`` picks).

Configure it as::

    TASKS = {"default": {"BACKEND": "axa_django.backends.QueueBackend",
                         "QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}}}

OPTIONS: ``MAX_ATTEMPTS`` (attempts per task, default AXA_DJANGO['MAX_ATTEMPTS']) and
``BACKOFF`` (seconds between attempts; default: exponential, as for background jobs).
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

# Only light modules at import time: Django may build this backend while apps load
# (``@task`` in a models module), before axa_django's models can be imported.
from .. import conf
from ..arguments import MAX_DEPTH, check_json, task_arguments_of
from ..checks import other_vendor, task_option_problems
from ..enqueuing.options import MAX_NAME_LENGTH, Options
from ..exceptions import JobCancelled, NotATask, WorkerInterrupted, WorkerLost, stored_type
from ..ops import tracing
from .framework import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)

if TYPE_CHECKING:
    from ..models import Job

__all__ = ["NotATask", "QueueBackend", "WorkerInterrupted", "WorkerLost", "queue_backend_aliases"]


_STATUSES = {
    # A task row never waits on parents (after= is a background_job option); one set so has not started.
    "waiting": TaskResultStatus.READY,
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    # Django has no cancelled state; a cancelled task will not run, so it did not succeed.
    "cancelled": TaskResultStatus.FAILED,
}


# Error entries the worker's SQL writes carry a bare type name; give them importable paths.
_ENTRY_TYPES = {"WorkerLost": stored_type(WorkerLost), "Interrupted": stored_type(WorkerInterrupted)}


class QueueBackend(BaseTaskBackend):
    """Stores tasks as axa_queue rows in the caller's transaction; ``runworker`` runs them."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Django builds backends at import time (``@task``): no database access here.
        super().__init__(alias, params)
        # Problems are kept, not raised: Django builds every backend for its system checks,
        # and check_task_backends (E103) reports them there; enqueue raises them.
        self.problems = task_option_problems(alias, self.options)
        options = self.options if isinstance(self.options, dict) else {}
        attempts = None if self.problems else options.get("MAX_ATTEMPTS")
        backoff = None if self.problems else options.get("BACKOFF")
        self.max_attempts: int | None = attempts
        self.backoff: float | None = None if backoff is None else float(backoff)

    # -- enqueue -----------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks, plus a task path short enough to be a job name."""
        super().validate_task(task)
        if len(task.module_path) > MAX_NAME_LENGTH:
            raise InvalidTask(f"Task path is longer than {MAX_NAME_LENGTH} characters: {task.module_path!r}")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write a row in the caller's transaction and return its READY result.

        When tracing, the row carries the enqueuing trace context, as for ``perform_later``.
        """
        from ..enqueuing import rows

        if self.problems:
            raise InvalidTaskBackend("; ".join(self.problems))
        self.validate_task(task)
        stored = _arguments(task, args, kwargs)
        options = Options(
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
            max_attempts=self.max_attempts,
            backend=self.alias,
        ).checked()
        job = tracing.enqueued(task.module_path, rows.write, task.module_path, stored, options, None)
        result = self._result(job, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results -----------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The result of the task row ``result_id``; TaskResultDoesNotExist if there is none."""
        return self._result(self._row(result_id))

    async def aget_result(self, result_id: str) -> TaskResult:
        """Async get_result."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    def _row(self, result_id: Any) -> Job:
        from ..models import Job

        try:
            key = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(conf.get("DATABASE")).filter(pk=key, backend=self.alias).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        return job

    def _result(self, job: Job, task: Task | None = None) -> TaskResult:
        """Map a row to a TaskResult (``task``: the one enqueued, else imported by path)."""
        if task is None:
            try:
                task = import_task(job.name)
            except NotATask as error:
                raise TaskResultDoesNotExist(f"{job.pk}: {error}") from None
        # A row enqueued without run_after has run_at = created_at (one statement's now()).
        run_after = None if job.run_at is None or job.run_at == job.created_at else job.run_at
        task = rebuild_task(task, priority=job.priority, queue_name=job.queue, run_after=run_after, backend=self.alias)
        stored = job.args if isinstance(job.args, dict) else {}
        errors = [
            TaskError(
                exception_class_path=_ENTRY_TYPES.get(str(entry.get("type")), str(entry.get("type"))),
                traceback=str(entry.get("traceback") or ""),
            )
            for entry in _entries(job.errors)
        ]
        if job.status == "cancelled" and not errors:
            errors.append(TaskError(exception_class_path=stored_type(JobCancelled), traceback=""))
        result = TaskResult(
            task=task,
            id=str(job.pk),
            status=_STATUSES[job.status],
            enqueued_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            last_attempted_at=job.started_at or _last_attempt(job.errors),
            args=list(stored.get("args") or []),
            kwargs=dict(stored.get("kwargs") or {}),
            backend=self.alias,
            errors=errors,
            worker_ids=_worker_ids(job),
        )
        if job.status == "completed":
            object.__setattr__(result, "_return_value", job.result)
        return result

    # -- checks ------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report a missing axa_django app or a queue database that is not PostgreSQL."""
        messages = list(super().check(**kwargs))
        if not apps.is_installed("axa_django"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses {type(self).__name__}, but axa_django is not in INSTALLED_APPS.",
                    hint="Add 'axa_django' to INSTALLED_APPS and run migrate.",
                    id="axa_django.E101",
                )
            )
        alias = conf.alias_as_written()
        if (vendor := other_vendor(alias)) is not None:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] stores tasks in database {alias!r}, which uses {vendor}, not PostgreSQL.",
                    hint="axa_django needs PostgreSQL; point AXA_DJANGO['DATABASE'] at a PostgreSQL database.",
                    id="axa_django.E102",
                )
            )
        return messages


# -- helpers -----------------------------------------------------------------------


def _arguments(task: Task, args: Any, kwargs: Any) -> dict[str, Any]:
    """The row's args object {"args": [...], "kwargs": {...}}, strict JSON or TypeError/ValueError."""
    # Django's shapes first (tuples become lists, as TaskResult.args does), then the
    # strict rule: no bytes, NaN, non-str keys, nothing that would not come back as it went in.
    stored = {"args": plain_json(list(args)), "kwargs": plain_json(dict(kwargs))}
    check_json(stored, task_arguments_of(task.module_path), levels=2)
    return stored


_NOT_SEQUENCES = (str, bytes, bytearray, memoryview)


def plain_json(value: Any, depth: int = 0) -> Any:
    """Django's normalize_json shapes (mappings to dicts, sequences such as tuples to lists,
    str/int/float subclasses such as enums to plain values), leaving anything else as it is
    for check_json to refuse by name: bytes are not decoded, unlike normalize_json.
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if depth > MAX_DEPTH + 1:  # + 1: a task's arguments sit inside its args list
        return value  # check_json refuses it as too deep; recursing further could overflow
    if isinstance(value, Mapping):
        return {plain_json(key, depth + 1): plain_json(item, depth + 1) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, _NOT_SEQUENCES):
        return [plain_json(item, depth + 1) for item in value]
    for base in (bool, str, int, float):  # bool first: it is an int
        if isinstance(value, base):
            return base(value)
    return value


def rebuild_task(task: Task, **changes: Any) -> Task:
    """A copy of ``task`` with ``changes``, without re-validating (the row was valid when written)."""
    copy = object.__new__(type(task))
    for item in dataclasses.fields(task):
        object.__setattr__(copy, item.name, changes.get(item.name, getattr(task, item.name)))
    return copy


def import_task(path: str) -> Task:
    """The Task at ``path`` if it belongs to a QueueBackend alias; NotATask otherwise.

    A row's name is data anyone who can write the table controls: only a module already
    imported or inside an installed app's package is imported, so a forged row cannot
    run another module's import side effects.
    """
    if refusal := _unimportable(path):
        raise NotATask(refusal)
    try:
        found = import_string(path)
    except ImportError as error:
        raise NotATask(f"cannot import task {path!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - importing user code may raise anything
        raise NotATask(f"importing task {path!r} raised {error!r}") from None
    if not isinstance(found, Task):
        raise NotATask(
            f"{path!r} is a {type(found).__module__}.{type(found).__qualname__}, not a django.tasks Task; "
            "the worker runs only functions decorated with @task"
        )
    if found.backend not in queue_backend_aliases():
        raise NotATask(f"task {path!r} belongs to backend {found.backend!r}, which is not a QueueBackend")
    return found


def _unimportable(path: str) -> str | None:
    """Why the worker will not import ``path``'s module, or None if it may."""
    module = path.rpartition(".")[0]
    if not module or not all(part.isidentifier() for part in module.split(".")):
        return f"{path!r} is not a dotted path module.attribute of a task"
    if module in sys.modules:
        return None
    if any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs()):
        return None
    return (
        f"module {module!r} is not imported and not inside an installed app, so the worker did not "
        f"import it to look for task {path!r}; tasks must live in a package listed in INSTALLED_APPS"
    )


def queue_backend_aliases() -> list[str]:
    """Aliases in settings.TASKS whose backend is a QueueBackend (no database access)."""
    aliases = []
    for alias, params in task_backends.settings.items():
        try:
            backend = import_string(params["BACKEND"])
        except Exception:  # noqa: BLE001 - a user's backend module may raise anything at import
            continue  # Django's own checks report a broken TASKS entry
        if isinstance(backend, type) and issubclass(backend, QueueBackend):
            aliases.append(alias)
    return sorted(aliases)


# A row's errors are data anyone who can write the table controls: a result reads what
# it can of them and never raises (a row with attempts in the billions lists its last ids).
MOST_WORKER_IDS = 1000


def _entries(errors: Any) -> list[dict[str, Any]]:
    """The row's error entries that are objects (a hand-written ``errors`` may be anything)."""
    return [entry for entry in errors if isinstance(entry, dict)] if isinstance(errors, list) else []


def _worker_ids(job: Job) -> list[str]:
    """One worker id per attempt since the row was last queued from attempt 0 (a retry from
    the admin starts again; ``errors`` keeps the earlier rounds' entries): the running or
    completed attempt's worker is the row's, earlier ones come from their error entries
    (the latest entry of an attempt number: a retry's entries come after the round before)."""
    by_attempt = {
        entry["attempt"]: entry.get("worker") for entry in _entries(job.errors) if type(entry.get("attempt")) is int
    }
    current = job.status in ("running", "completed") and job.worker_id is not None
    ids = []
    for attempt in range(max(1, job.attempts - MOST_WORKER_IDS + 1), job.attempts + 1):
        worker = job.worker_id if current and attempt == job.attempts else by_attempt.get(attempt)
        if worker is None and attempt == job.attempts:
            worker = job.worker_id
        ids.append("" if worker is None else str(worker))
    return ids


def _last_attempt(errors: Any) -> Any:
    for entry in reversed(_entries(errors)):
        if isinstance(entry.get("at"), str):
            try:
                return parse_datetime(entry["at"])
            except ValueError:  # well formed but no date (February 30th): look further back
                continue
    return None
