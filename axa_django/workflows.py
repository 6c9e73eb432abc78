"""``workflow()`` and ``batch()``: groups of jobs written together, and batch callbacks."""

from __future__ import annotations

import uuid
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar

from django.db import connections, transaction

from . import conf, dependencies
from .arguments import bind
from .enqueuing import children
from .enqueuing.encoding import BulkResult
from .enqueuing.options import Options, check_text
from .execution.inline import run_inline
from .ids import uuid7
from .models import Job, Workflow
from .models.moves import mark_loaded
from .registry import JobFunction, background_job, registry

CALLBACK = "axa_django.batch_callback"
G = TypeVar("G", bound="_Group")


class _Group:
    """Jobs added inside a ``with`` block, written in one transaction when it ends without error."""

    kind = Workflow.Kind.WORKFLOW

    def __init__(self, name: str = "") -> None:
        if not isinstance(name, str):
            raise TypeError(f"a {self.kind} name must be a str, not {type(name).__name__}")
        self.name = check_text(name, f"{self.kind} name")
        self.id = uuid7()
        self.jobs: list[Job] = []
        self._items: list[tuple[str, dict[str, Any], Options, uuid.UUID]] = []
        self._senders: list[JobFunction[Any, Any] | None] = []
        self._open = False
        self._written = False

    def __enter__(self: G) -> G:
        if self._written:
            raise RuntimeError(f"this {self.kind} was written when its block ended; start a new one")
        self._open = True
        return self

    def _add(self, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any) -> Job:
        if not self._open:
            raise RuntimeError(f"add jobs inside 'with {self.kind}(...) as w:', before the block ends")
        if not isinstance(function, JobFunction):
            raise TypeError(f"{self.kind}.add takes a @background_job function first, not {type(function).__name__}")
        arguments = bind(function.signature, function.name, args, kwargs)
        job_options = replace(function._options_for(arguments), workflow=self.id, **options).checked()
        job_id = uuid7()
        self._items.append((function.name, arguments, job_options, job_id))
        self._senders.append(function)
        job = Job(id=job_id, name=function.name, args=arguments, status=Job.Status.WAITING, workflow_id=self.id)
        self.jobs.append(job)
        return job

    def _extra(self) -> list[tuple[str, dict[str, Any], Options, uuid.UUID]]:
        return []

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._open = False
        if kind is not None:
            return  # nothing was written; the error goes on
        items = self._items + self._extra()
        using = conf.queue_database()
        with transaction.atomic(using=using):
            Workflow.objects.using(using).create(id=self.id, kind=self.kind, name=self.name)
            senders = self._senders + [registry.get(CALLBACK)] * (len(items) - len(self._senders))
            written = children.write_children(items, senders) if items else BulkResult()
        found = {job.pk: job.status for job in written}
        for job in self.jobs:
            job.status = found.get(job.pk, job.status)
            job._state.adding, job._state.db = False, using
            mark_loaded(job)
        self._written = True
        if conf.get("MODE") == "immediate":
            run_group_inline(self.id)

    @property
    def workflow(self) -> Workflow:
        """The group's row (once the block has ended)."""
        return Workflow.objects.using(conf.queue_database()).get(pk=self.id)

    def cancel(self) -> int:
        """Cancel every job of the group not yet finished; return how many changed."""
        return Job.objects.using(conf.queue_database()).filter(workflow_id=self.id).cancel()


class workflow(_Group):
    """A named group of jobs with dependencies between them; every row commits together at the block's end.

    ``wf.add(job, *args, after=[...], on_parent_failure="cancel", **kwargs)`` adds a
    call and returns its Job (written when the block ends).
    """

    def add(
        self,
        function: Any,
        /,
        *args: Any,
        after: Any = (),
        on_parent_failure: str = "cancel",
        **kwargs: Any,
    ) -> Job:
        """Add a call of ``function`` that runs once every job in ``after`` has finished."""
        # A job can only wait for jobs that exist or were added before it, so no cycle can form.
        ids = dependencies.parent_ids(after)
        return self._add(function, args, kwargs, after=ids, on_parent_failure=on_parent_failure)


class batch(_Group):
    """Jobs written together; ``on_complete`` runs once all finished (any outcome), ``on_failure`` once if any failed.

    Each callback is a @background_job (with its ``.using(...)`` options) called as
    ``callback(batch_id=..., counts={status: n, ...})``; a batch of no jobs runs
    ``on_complete`` at once.
    """

    kind = Workflow.Kind.BATCH

    def __init__(self, name: str = "", *, on_complete: Any = None, on_failure: Any = None) -> None:
        super().__init__(name)
        self.on_complete = _check_callback(on_complete, "on_complete")
        self.on_failure = _check_callback(on_failure, "on_failure")

    def add(self, function: Any, /, *args: Any, **kwargs: Any) -> Job:
        """Add a call of ``function`` to the batch."""
        return self._add(function, args, kwargs)

    def _extra(self) -> list[tuple[str, dict[str, Any], Options, uuid.UUID]]:
        after = tuple(job.pk for job in self.jobs)
        extra = []
        for which, callback in (("complete", self.on_complete), ("failure", self.on_failure)):
            if callback is None or (which == "failure" and not after):
                continue  # a batch of no jobs cannot fail
            options = replace(
                callback.options, after=after, on_parent_failure="run", workflow=self.id, unique_key=None
            ).checked()
            arguments = {"batch_id": str(self.id), "callback": callback.name, "kind": which}
            extra.append((CALLBACK, arguments, options, uuid7()))
        return extra


def _check_callback(callback: Any, what: str) -> JobFunction[Any, Any] | None:
    if callback is None:
        return None
    if not isinstance(callback, JobFunction):
        raise TypeError(f"{what} must be a @background_job function (or job.using(...)), not {type(callback).__name__}")
    if callback.takes_context:
        raise TypeError(f"{what}: job {callback.name!r} takes a context; a batch callback is called without one")
    try:
        callback.signature.bind(batch_id="", counts={})
    except TypeError as error:
        raise TypeError(
            f"{what}: job {callback.name!r} cannot be called as {callback.name}(batch_id=..., counts=...): {error}; "
            "give it the parameters batch_id: str and counts: dict[str, int]"
        ) from None
    return callback


def counts_of(batch_id: uuid.UUID) -> dict[str, int]:
    """The batch's jobs by status, its callbacks left out."""
    with connections[conf.queue_database()].cursor() as cursor:
        cursor.execute(
            "SELECT status, count(*) FROM axa_queue WHERE workflow_id = %s AND name <> %s GROUP BY status",
            [batch_id, CALLBACK],
        )
        found = dict(cursor.fetchall())
    counts = {status: found.pop(status, 0) for status in Job.Status.values}
    counts.update(found)
    counts["total"] = sum(counts.values())
    return counts


@background_job(name=CALLBACK, max_attempts=None)
def batch_callback(batch_id: str, callback: str, kind: str) -> Any:
    """Call a batch's on_complete (or, if a job of it failed, on_failure) with the batch id and counts."""
    counts = counts_of(uuid.UUID(batch_id))
    if kind == "failure" and not counts["failed"] + counts["cancelled"]:
        return {"called": False, "reason": "no job of the batch failed"}
    function = registry.get(callback)
    if function is None:
        raise LookupError(f"batch callback {callback!r} is not a job this worker knows; register it in a jobs.py")
    # An async callback returns a coroutine: the worker runs it as it runs any async job.
    return function.func(batch_id=batch_id, counts=counts)


def run_group_inline(group_id: uuid.UUID) -> None:
    """Immediate mode: run the group's queued jobs, and those they release, until none is left."""
    using = conf.queue_database()
    while True:
        ready = Job.objects.using(using).filter(workflow_id=group_id, status=Job.Status.QUEUED, name__in=list(registry))
        ready_jobs = list(ready.order_by("run_at"))
        if not ready_jobs:
            return
        for job in ready_jobs:
            run_inline(job, registry[job.name])
