"""Helpers for your own tests: see what was enqueued, and run it in-process on the test's connection.

``run_jobs()`` claims and finishes rows with the worker's own statements and runs them
through ``execution.inline.perform_here`` (the worker's ``perform``, with its timeouts), so
attempts, retries, unique keys, results and errors are recorded as a worker records
them, inside the test's transaction when it has one (Django's ``TestCase``,
``@pytest.mark.django_db``).
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import warnings
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from . import conf, registry, sql
from .enqueuing.reach import UnreachableJobWarning
from .execution import Claimed, Outcome, attempt_of, finish, log_receiver_errors, send_finished
from .execution.attempts import RAISE_INLINE, Attempt, JobFailed, Recorder
from .execution.inline import perform_here
from .models import Job
from .selection import task_backend_aliases
from .signals import job_started

__all__ = [
    "Attempt",
    "JobFailed",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued_jobs",
    "raise_failures",
    "run_jobs",
]

JobRef = registry.JobFunction[Any, Any] | str
_EMPTY = inspect.Parameter.empty
# Rows claimed per round of run_jobs().
ROUND_SIZE = 100
# The worker's due test; run_jobs() puts its own clock in its place (see _claim_statement).
_DUE = "run_at <= now()"
# A retry's run_at, counted from the real time: inside a test's transaction now() is
# the time the transaction began, so FINISH's now() + backoff may already be past.
_RETRY_AT = "UPDATE axa_queue SET run_at = clock_timestamp() + make_interval(secs => %s) WHERE id = %s"


def _name(job: JobRef) -> str:
    if isinstance(job, registry.JobFunction):
        return job.name
    if isinstance(job, str):
        return job
    raise TypeError(f"expected a job (a @background_job function) or a job name, not {type(job).__name__}")


def _warn_unreachable(job: JobRef, helper: str) -> None:
    """Warn, as @background_job did, when ``job`` is one no worker would know; the caller's caller is named."""
    function = job if isinstance(job, registry.JobFunction) else registry.get(_name(job))
    if function is not None and function.unreachable is not None:
        warnings.warn(f"{helper}: {function.unreachable}", UnreachableJobWarning, stacklevel=3)


def enqueued_jobs(name: JobRef | None = None, queue: str | None = None) -> list[Job]:
    """Queued rows (scheduled ones too), oldest first; only those of job ``name`` and ``queue`` if given."""
    rows = Job.objects.using(conf.get("DATABASE")).filter(status=Job.Status.QUEUED)
    if name is not None:
        rows = rows.filter(name=_name(name))
    if queue is not None:
        rows = rows.filter(queue=queue)
    return list(rows.order_by("created_at", "run_at", "id"))


def _defaults(job: JobRef, args: dict[str, Any]) -> dict[str, Any]:
    """The defaults of the parameters in ``args``; TypeError for a parameter the job does not have,
    with the one it was likely meant as, as perform_later says it."""
    if not isinstance(job, registry.JobFunction):
        return {}
    unexpected = registry.unknown_parameters(job, args)
    if unexpected is not None:
        raise TypeError(unexpected)
    parameters = job.signature.parameters
    return {key: parameters[key].default for key in args if key in parameters and parameters[key].default is not _EMPTY}


def _matching(job: JobRef, args: dict[str, Any]) -> list[Job]:
    name = _name(job)
    defaults = _defaults(job, args)
    rows = Job.objects.using(conf.get("DATABASE")).filter(status=Job.Status.QUEUED, name=name)
    for index, (key, value) in enumerate(args.items()):
        # An exact JSON comparison: 1 matches 1 and 1.0 but not true, [1] not [1, 2].
        alias = f"_arg{index}"
        match = Q(**{alias: value})
        if key in defaults and _json(defaults[key]) == _json(value):
            match |= ~Q(args__has_key=key)  # left out at enqueue: the job runs with its default
        rows = rows.alias(**{alias: KeyTransform(key, "args")}).filter(match)
    return list(rows.order_by("created_at", "run_at", "id"))


def _json(value: Any) -> str | None:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None


def _describe(name: str) -> str:
    queued = enqueued_jobs(name)
    if queued:
        lines = [f"queued jobs {name} ({len(queued)}):"]
        lines += [f"  {row.args!r} (queue {row.queue!r}, run_at {row.run_at:%Y-%m-%d %H:%M:%S})" for row in queued[:20]]
        if len(queued) > 20:
            lines.append(f"  ... and {len(queued) - 20} more")
        return "\n".join(lines)
    others = sorted({row.name for row in enqueued_jobs()})
    if others:
        return f"no job {name} is queued; queued are: {', '.join(others)}"
    return "nothing is queued"


def assert_enqueued(job: JobRef, /, **args: Any) -> Job:
    """Assert that a queued row of ``job`` has these argument values (others may differ); return the oldest.

    Warns with UnreachableJobWarning if ``job`` is defined where no worker imports it.
    """
    _warn_unreachable(job, "assert_enqueued()")
    found = _matching(job, args)
    if not found:
        name = _name(job)
        raise AssertionError(f"no queued job {name} with arguments {args!r}; {_describe(name)}")
    return found[0]


def assert_not_enqueued(job: JobRef, /, **args: Any) -> None:
    """Assert that no queued row of ``job`` has these argument values (none at all without ``args``)."""
    found = _matching(job, args)
    if found:
        name = _name(job)
        raise AssertionError(f"{len(found)} queued job(s) {name} with arguments {args!r}; {_describe(name)}")


@contextlib.contextmanager
def raise_failures(enabled: bool = True) -> Iterator[None]:
    """In immediate mode, make a job that ends failed raise JobFailed from ``perform_later`` (also a decorator)."""
    token = RAISE_INLINE.set(enabled)
    try:
        yield
    finally:
        RAISE_INLINE.reset(token)


def _due(now: datetime.datetime | None, include_future: bool) -> tuple[str, dict[str, Any]]:
    if include_future:
        if now is not None:
            raise ValueError("pass now or include_future, not both")
        return "true", {}
    if now is None:
        # The real time at each claim, so jobs enqueued by the jobs are due next round.
        return "run_at <= clock_timestamp()", {}
    if not isinstance(now, datetime.datetime):
        raise TypeError(f"now must be a datetime, not {type(now).__name__}")
    if timezone.is_naive(now):
        if settings.USE_TZ:
            raise ValueError("now must be timezone-aware; use django.utils.timezone.now() + timedelta(...)")
        now = timezone.make_aware(now, timezone.get_default_timezone())
    return "run_at <= %(due)s", {"due": now}


def _claim_statement(name: str | None, queue: str | None, due: str) -> str:
    if name is None:
        names, backends = sorted(registry.registry), task_backend_aliases()
    else:
        names, backends = [name], []
    text = sql.compose(sql.CLAIM, names, backends, [queue] if queue is not None else None)
    if _DUE not in text:
        raise RuntimeError("axa_django.sql.CLAIM no longer tests run_at <= now(); update axa_django.testing")
    return text.replace(_DUE, due)


def _resolve(job: Claimed) -> tuple[Any, Any]:
    """The sender of the job's signals and what perform() runs, as the worker picks them.

    A django.tasks row runs through its task runner and its signals have no sender.
    """
    if job.backend is not None:
        # Lazy: taskrunner imports the tasks framework, which a project may not have (Django 5.2).
        from .execution.taskrunner import resolver

        runner, _ = resolver(job)
        return None, runner
    function = registry.get(job.name)
    return function, function


def _run_one(using: str, job: Claimed, timeout: float | None) -> tuple[Outcome, Attempt, Any, Any]:
    sender, function = _resolve(job)
    recorder = Recorder(function) if function is not None else None
    log_receiver_errors(
        "job_started", job_started.send_robust(sender=sender, job_id=job.id, name=job.name, attempt=job.attempt)
    )
    outcome = perform_here(job, recorder if recorder is not None else function, timeout, using)
    return outcome, attempt_of(outcome, recorder.raised if recorder else None), sender, function


def run_jobs(
    name: JobRef | None = None,
    queue: str | None = None,
    *,
    raise_failures: bool = True,
    now: datetime.datetime | None = None,
    include_future: bool = False,
    max_rounds: int = 50,
) -> list[Attempt]:
    """Run the queued jobs that are due, in this thread and on the test's connection, until none is left.

    Each round claims up to ROUND_SIZE due rows (best priority, then oldest run_at
    first) of ``name`` (default: every registered job and django.tasks backend) in
    ``queue`` (default: all), runs them, and records their outcomes as a worker does.
    Jobs the jobs enqueue, and retries that are due (``backoff=0``), run in later
    rounds. A job is due when its ``run_at`` has passed; ``now`` runs those due by that
    time instead, ``include_future=True`` runs every queued one.

    Returns the attempts in the order they ran. Unless ``raise_failures=False``, raises
    JobFailed afterwards if any job's last attempt failed (ended failed, or queued for
    a retry later); its cause is what the job raised. Raises RuntimeError if jobs are
    still due after ``max_rounds`` rounds (a job that keeps enqueueing itself). Warns
    with UnreachableJobWarning for each job it runs that is defined where no worker
    imports it: it passes here and would wait forever in production.
    """
    job_name = _name(name) if name is not None else None
    if job_name is not None and registry.get(job_name) is None:
        raise ValueError(f"no job {job_name!r} is registered in this process; run_jobs() runs registered jobs only")
    if type(max_rounds) is not int or max_rounds < 1:
        raise ValueError(f"max_rounds must be a positive int, not {max_rounds!r}")
    due, params = _due(now, include_future)
    statement = _claim_statement(job_name, queue, due)
    using = conf.get("DATABASE")
    attempts: list[Attempt] = []
    warned: set[str] = set()
    for _ in range(max_rounds):
        with connections[using].cursor() as cursor:
            cursor.execute(statement, {"worker": None, "limit": ROUND_SIZE, "ahead": False, **params})
            rows = sorted(cursor.fetchall(), key=lambda r: (-r[7], r[8]))
            claimed = [
                Claimed(job_id, job_name_, None, attempt, max_attempts, backend, args_json=args)
                for job_id, job_name_, args, attempt, max_attempts, backend, *_ in rows
            ]
            timeouts = {row[0]: row[10] for row in rows}  # the rows' own timeouts (CLAIM_RETURNING)
            if not claimed:
                break
            # RETURNING comes in table order; run them in the order the worker picked them.
            order = {row.pk: index for index, row in enumerate(_in_claim_order(using, [c.id for c in claimed]))}
            claimed.sort(key=lambda c: order[c.id])
        for job in claimed:
            if job.backend is None and job.name not in warned:
                warned.add(job.name)
                _warn_unreachable(job.name, "run_jobs()")
            outcome, attempt, sender, function = _run_one(using, job, timeouts[job.id])
            with connections[using].cursor() as cursor:
                # Django's cursor wraps psycopg's; FINISH needs the raw one for arrays.
                unwritten = finish(cursor.cursor, [outcome], None)
                if outcome.status == "queued" and not unwritten:
                    cursor.execute(_RETRY_AT, [outcome.delay, outcome.id])
            attempts.append(attempt)
            send_finished(sender, outcome, robust=True)
            if job.backend is not None:
                function.finished(outcome)  # the task runner sends task_finished
    else:
        raise RuntimeError(
            f"jobs were still due after {max_rounds} rounds of run_jobs(); a job may keep enqueueing itself "
            "(pass max_rounds=... to allow more)"
        )
    if raise_failures:
        last = {a.id: a for a in attempts}
        failures = [a for a in last.values() if a.status in ("failed", "queued")]
        if failures:
            raise JobFailed(failures, attempts) from failures[0].exception
    return attempts


def _in_claim_order(using: str, ids: list[Any]) -> list[Job]:
    rows = Job.objects.using(using).filter(pk__in=ids).only("id").order_by("-priority", "run_at", "created_at")
    return list(rows)
