"""@background_job, JobFunction and the name -> JobFunction registry."""

from __future__ import annotations

import inspect
import random
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Generic, NoReturn, ParamSpec, TypeVar, overload

from asgiref.sync import sync_to_async
from django.core import checks
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import conf
from .arguments import bind, check_kwargs, misspelt_keywords, of_item, prepare
from .enqueuing import cronexpr, flow, rows
from .enqueuing.encoding import BulkResult
from .enqueuing.options import MAX_DELAY, Options, check_name, check_text
from .enqueuing.reach import VERDICTS, UnreachableJobWarning, warning_text, why_unreachable
from .execution.inline import run_inline
from .models import Job
from .ops import tracing

P = ParamSpec("P")
R = TypeVar("R")

registry: dict[str, JobFunction[Any, Any]] = {}

# The verdict of each (job name, queue) enqueued so far, None for known (reach.Verdicts):
# an enqueue of a known job into a known queue costs this one dict lookup, no lock.
_verdicts = VERDICTS.cache
_UNSEEN = object()

# Celery's and django.tasks' ways to enqueue, which a JobFunction lacks: (their call, ours),
# said by __getattr__ in the AttributeError rather than a bare "has no attribute".
_OTHER_WAYS = {
    "delay": ("delay(...)", "{}.perform_later(...), with the same arguments"),
    "apply_async": (
        "apply_async(args, kwargs, countdown=..., queue=...)",
        "{}.using(delay=timedelta(seconds=...), queue=..., priority=...).perform_later(*args, **kwargs)",
    ),
    "enqueue": ("enqueue(...) (a django.tasks @task's)", "{}.perform_later(...)"),
}


def default_backoff(attempt: int) -> float:
    """Seconds before retry ``attempt + 1``: 2, 4, 8, ... up to an hour, with ±25% jitter."""
    return min(2.0**attempt, 3600.0) * random.uniform(0.75, 1.25)


def check_backoff(backoff: Any, job: str) -> Callable[[int], float] | float | None:
    """Return ``backoff`` if it can space retries: None, seconds >= 0, or a callable taking the attempt."""
    if backoff is None:
        return None
    if callable(backoff):
        try:
            inspect.signature(backoff).bind(1)
        except TypeError:
            raise TypeError(
                f"job {job!r}: backoff {backoff!r} cannot be called with one argument (the attempt number); "
                "pass seconds, or a function like lambda attempt: 2 ** attempt"
            ) from None
        except ValueError:
            pass  # no signature to read (some builtins): trust it
        return backoff
    if not isinstance(backoff, int | float) or isinstance(backoff, bool):
        raise TypeError(f"job {job!r}: backoff must be a number of seconds or a callable, not {type(backoff).__name__}")
    if not 0 <= backoff <= MAX_DELAY.total_seconds():
        raise ValueError(
            f"job {job!r}: backoff is {backoff!r}; it must be a number of seconds from 0 to "
            f"{MAX_DELAY.total_seconds():.0f} (0 retries at once)"
        )
    return backoff


def _split(
    call: Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call of perform_later_many as (args, kwargs); a dict, the common call, goes in as it is (bind copies)."""
    if type(call) is dict:
        return (), call
    args, kwargs = ((), call) if isinstance(call, Mapping) else call
    return tuple(args), dict(kwargs)


class JobFunction(Generic[P, R]):
    """A function registered as a background job; call it to run it here and now."""

    def __init__(
        self,
        func: Callable[..., R],
        *,
        name: str,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int | None = None,
        max_losses: int | None = None,
        backoff: Callable[[int], float] | float | None = None,
        unique: Callable[..., str | None] | None = None,
        cron: str | None = None,
        takes_context: bool = False,
        options: Options | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        concurrency_key: Callable[..., str] | None = None,
        rate: str | None = None,
        rate_key: Callable[..., str] | None = None,
    ) -> None:
        self.func = func
        self.name = check_name(name)
        self.max_attempts = max_attempts
        self.backoff = check_backoff(backoff, name)
        self.unique = unique
        self.concurrency = flow.check_concurrency(concurrency, name)
        self.concurrency_key = flow.check_key_function(
            concurrency_key, "concurrency_key", "concurrency", self.concurrency is not None, name
        )
        self.rate = flow.parse_rate(rate, name)
        self.rate_key = flow.check_key_function(rate_key, "rate_key", "rate", self.rate is not None, name)
        if self.concurrency is not None and self.rate is not None:
            raise TypeError(
                f"job {name!r}: concurrency= and rate= on one job are not supported; "
                "limit it by one of them, or split the work into two jobs"
            )
        self.cron = cron
        self.takes_context = takes_context
        self.is_async = inspect.iscoroutinefunction(func)
        self.signature = inspect.signature(func)
        if takes_context:
            parameters = list(self.signature.parameters.values())
            if not parameters or parameters[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise TypeError(f"job {name!r} takes_context=True but has no first positional parameter")
            self.signature = self.signature.replace(parameters=parameters[1:])
        prepare(self.signature, func)  # binding and type checks worked out once, not per enqueue
        try:
            self.options = (
                options
                or Options(
                    queue=queue, priority=priority, max_attempts=max_attempts, max_losses=max_losses, timeout=timeout
                )
            ).checked()
        except (TypeError, ValueError) as error:
            raise type(error)(f"job {name!r}: {error}") from None
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__qualname__ = getattr(func, "__qualname__", name)
        self.__module__ = func.__module__
        self.__wrapped__ = func
        # Set by @background_job: why no worker would know this job (reach.why_unreachable), or None.
        self.unreachable: str | None = None

    def __repr__(self) -> str:
        return f"<JobFunction {self.name}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    @property
    def attempts_allowed(self) -> int:
        """Attempts a row of this job gets when the row does not say."""
        return self.max_attempts or conf.get("MAX_ATTEMPTS")

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait after failed ``attempt`` before the next one."""
        if self.backoff is None:
            return default_backoff(attempt)
        if callable(self.backoff):
            return float(self.backoff(attempt))
        return float(self.backoff)

    def using(self, **options: Any) -> JobFunction[P, R]:
        """Return a copy whose enqueues use these options (queue, priority, run_at, delay, ...)."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.options = replace(self.options, **options).checked()
        for key, limit in (("concurrency_key", "concurrency"), ("rate_key", "rate")):
            if options.get(key) is not None and getattr(self, limit) is None:
                raise ValueError(f"job {self.name!r} has no {limit} limit, so using({key}=...) would key nothing")
        return copy

    def _options_for(self, arguments: dict[str, Any]) -> Options:
        options = self.options
        if self.unique is not None and options.unique_key is None:
            key = self.unique(**arguments)
            if key is not None:
                options = replace(options, unique_key=check_text(str(key), "unique key"))
        if self.concurrency is not None and options.concurrency_key is None:
            key = flow.SHARED
            if self.concurrency_key is not None:
                key = flow.compute_key(self.concurrency_key, arguments, "concurrency_key", self.name)
            options = replace(options, concurrency_key=key)
        if self.rate is not None and options.rate_key is None:
            key = flow.SHARED
            if self.rate_key is not None:
                key = flow.compute_key(self.rate_key, arguments, "rate_key", self.name)
            options = replace(options, rate_key=key)
        return options

    def _fixed_options(self) -> Options | None:
        """Every call's options when no key is computed from a call's arguments (_options_for), else None."""
        options = self.options
        if (
            (self.unique is not None and options.unique_key is None)
            or (self.concurrency is not None and options.concurrency_key is None)
            or (self.rate is not None and options.rate_key is None)
        ):
            return None
        return options

    def _items(
        self, calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> Iterator[tuple[str, dict[str, Any], Options]]:
        """Each call bound and checked, with its options; a bad one raises naming its index."""
        for index, (args, kwargs) in enumerate(calls):
            try:
                arguments = bind(self.signature, self.name, args, kwargs)
            except (TypeError, ValueError) as error:
                raise of_item(error, index) from None
            yield self.name, arguments, self._options_for(arguments)

    def perform_later(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Write a job row for a worker (or run it now in immediate mode) and return it."""
        arguments = bind(self.signature, self.name, args, kwargs)
        options = self._options_for(arguments)
        if _verdicts.get((self.name, options.queue), _UNSEEN) is not None:
            _warn_if_unknown(self.name, options.queue)
        job = tracing.enqueued(self.name, rows.write, self.name, arguments, options, self)
        if conf.get("MODE") == "immediate" and job.status == Job.Status.QUEUED:
            run_inline(job, self)
        return job

    def perform_later_many(
        self, calls: Iterable[Mapping[str, Any] | tuple[tuple[Any, ...], Mapping[str, Any]]]
    ) -> BulkResult:
        """Enqueue many calls in one statement; each is a kwargs mapping or an (args, kwargs) pair."""
        # Read whole first, and each call's args and kwargs too: a generator over a
        # queryset's iterator(), or a queryset given as args, would query the connection
        # the COPY below holds. The calls are then checked as write_many reads them: before
        # it writes any, or, for a batch it copies, while the server takes in the rows
        # before (a bad one aborts the COPY, writing none).
        items = self._items([_split(call) for call in calls])
        jobs = tracing.enqueued(self.name, rows.write_many, items, self, self._fixed_options())
        # Once per call (every item goes to this queue), after the items were checked as
        # written: a bad one raises before any SQL, and the judgement may read the tables.
        if _verdicts.get((self.name, self.options.queue), _UNSEEN) is not None:
            _warn_if_unknown(self.name, self.options.queue)
        if conf.get("MODE") == "immediate":
            for job in jobs:
                run_inline(job, self)
        return jobs

    def perform_now(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the job inline, without a row, and return its value."""
        if self.takes_context:
            raise TypeError(f"job {self.name!r} takes a context; call perform_later in immediate mode instead")
        return self.func(*args, **kwargs)

    async def aperform_later(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Async perform_later, for async views."""
        # Judged here, so that a warning names the caller's line, not asgiref's; a first
        # judgement may read the tables, which only a thread may.
        queue = self.options.queue  # every call's: _options_for changes keys, not the queue
        verdict = _verdicts.get((self.name, queue), _UNSEEN)
        if verdict is _UNSEEN:
            verdict = await sync_to_async(VERDICTS.verdict)(self.name, queue, registry)
        if verdict is not None:
            _warn(self.name, queue, verdict)
        return await sync_to_async(self._perform_later)(args, kwargs)

    def _perform_later(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Job:
        """perform_later, judged already."""
        arguments = bind(self.signature, self.name, args, kwargs)
        job = tracing.enqueued(self.name, rows.write, self.name, arguments, self._options_for(arguments), self)
        if conf.get("MODE") == "immediate" and job.status == Job.Status.QUEUED:
            run_inline(job, self)
        return job

    def __getattr__(self, attribute: str) -> NoReturn:
        # Only failed lookups come here, so an attribute that exists costs nothing more.
        if attribute not in _OTHER_WAYS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attribute!r}", name=attribute)
        theirs, ours = _OTHER_WAYS[attribute]
        raise AttributeError(
            f"{type(self).__name__} object has no attribute {attribute!r}: {self.name!r} is an axa_django "
            f"background job, which has no {theirs}; enqueue it with {ours.format(self.__name__)}",
            name=attribute,
        )


@overload
def background_job(func: Callable[P, R], /) -> JobFunction[P, R]: ...
@overload
def background_job(
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int | None = None,
    max_losses: int | None = None,
    backoff: Callable[[int], float] | float | None = None,
    unique: Callable[..., str | None] | None = None,
    cron: str | None = None,
    takes_context: bool = False,
    timeout: float | None = None,
    concurrency: int | None = None,
    concurrency_key: Callable[..., str] | None = None,
    rate: str | None = None,
    rate_key: Callable[..., str] | None = None,
) -> Callable[[Callable[P, R]], JobFunction[P, R]]: ...
def background_job(func: Callable[..., Any] | None = None, /, *, name: str | None = None, **options: Any) -> Any:
    """Register a function as a background job, named ``module.qualname`` unless ``name`` is given.

    Warns with UnreachableJobWarning when the function's module is one no worker
    imports at start (not an installed app's jobs module, nor imported by one).
    """

    def register(func: Callable[..., Any]) -> JobFunction[Any, Any]:
        if "<locals>" in func.__qualname__ and name is None:
            raise TypeError(
                f"{func.__qualname__} is defined inside a function; a worker could not find it. "
                "Define jobs at module level, or pass name=..."
            )
        job = JobFunction(func, name=name or f"{func.__module__}.{func.__qualname__}", **options)
        if job.cron is not None:
            cronexpr.check(job.name, job.cron, job.signature)
        existing = registry.get(job.name)
        if existing is not None and _origin(existing.func) != _origin(func):
            raise ValueError(
                f"job name {job.name!r} is registered twice: to {_origin(existing.func)} and to {_origin(func)}; "
                "give one of them another name=..."
            )
        job.unreachable = why_unreachable(job.name, getattr(func, "__module__", None))
        if job.unreachable is not None:
            warnings.warn(job.unreachable, UnreachableJobWarning, stacklevel=_outside_this_module())
        registry[job.name] = job
        VERDICTS.forget()
        return job

    if func is not None:
        return register(func)
    return register


def _outside_this_module() -> int:
    """The stacklevel of warnings.warn, called from here, that names the first caller outside this module."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def get(name: str) -> JobFunction[Any, Any] | None:
    """Return the job registered under ``name``, or None."""
    return registry.get(name)


def enqueue(name: str, /, **kwargs: Any) -> Job:
    """Enqueue a job by name, for a job this process may not define (UnknownJobWarning says so)."""
    job = registry.get(check_name(name))
    if job is not None:
        return job.perform_later(**kwargs)
    arguments = check_kwargs(name, kwargs)
    _warn_if_unknown(name, Options.queue)
    return tracing.enqueued(name, rows.write, name, arguments, Options(), None)


def enqueue_many(name: str, calls: Iterable[Mapping[str, Any]], /) -> BulkResult:
    """Enqueue many calls of a job by name in one statement."""
    job = registry.get(check_name(name))
    if job is not None:
        return job.perform_later_many(calls)
    items = []
    for index, kwargs in enumerate(calls):
        try:
            items.append((name, check_kwargs(name, dict(kwargs)), Options()))
        except (TypeError, ValueError) as error:
            raise of_item(error, index) from None
    _warn_if_unknown(name, Options.queue)
    return tracing.enqueued(name, rows.write_many, items, None)


def _warn_if_unknown(name: str, queue: str) -> None:
    """UnknownJobWarning or UnknownQueueWarning unless this process knows job ``name`` and ``queue``."""
    verdict = VERDICTS.verdict(name, queue, registry)
    if verdict is not None:
        _warn(name, queue, verdict)


def _warn(name: str, queue: str, verdict: tuple[type[UnreachableJobWarning], tuple[str, ...]]) -> None:
    warnings.warn(warning_text(name, queue, verdict), verdict[0], stacklevel=_outside_this_module())


def forget_verdicts() -> None:
    """Judge every (job name, queue) afresh from the next enqueue on, and read the paused and limited
    queues again: done when a job registers or the settings change."""
    VERDICTS.forget()


@receiver(setting_changed)
def _forget_verdicts(*, setting: str, **kwargs: Any) -> None:
    if setting in ("TASKS", "AXA_DJANGO", "DATABASES"):
        VERDICTS.forget()


def unknown_parameters(job: JobFunction[Any, Any], kwargs: Mapping[str, Any]) -> str | None:
    """Why ``kwargs`` name parameters ``job`` lacks, each with the one it was likely meant as (as perform_later
    says it); None if ``job`` has them all."""
    found = misspelt_keywords(job.signature, (), dict(kwargs))
    if found is None:
        return None
    said, takes = found
    return f"job {job.name!r} has no parameter {', '.join(said)}; {takes}"


@checks.register()
def check_cron_extra(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E010: periodic jobs, and no croniter to schedule them (the cron extra is not installed)."""
    periodic = sorted(name for name, job in registry.items() if job.cron is not None)
    if not periodic or cronexpr.installed():
        return []
    return [
        checks.Error(
            f"job(s) {', '.join(map(repr, periodic))} have cron=..., which needs croniter, and it is not installed: "
            "no worker could schedule them.",
            hint="Install the cron extra: pip install 'axa-django[cron]' (with psycopg's libpq: "
            "'axa-django[binary,cron]').",
            id="axa_django.E010",
        )
    ]
