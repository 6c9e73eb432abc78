"""OpenTelemetry: enqueue records the trace context on the row; the worker runs the job in a span linked to it.

Active only when ``opentelemetry-api`` is installed (the ``tracing`` extra) and the
project has set a tracer provider (its SDK); otherwise enqueue and the worker run
exactly as without it, with no extra statement. The context is the W3C carrier
(``traceparent``, ``tracestate``) as jsonb in ``axa_queue.trace_context``: a
column of its own, so that the seed's statements and the job's args are untouched.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import DatabaseError, connections, transaction

from .. import conf

try:
    from opentelemetry import propagate, trace
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

TRACER = "axa_django"
RECORD = "UPDATE axa_queue SET trace_context = %s::jsonb WHERE id = ANY(%s::uuid[])"
READ = "SELECT trace_context::text, queue FROM axa_queue WHERE id = %s"


# Asking OpenTelemetry for the provider reads os.environ each time it has none (0.9 us,
# a thirtieth of a no-op job's worker CPU): without one, it is asked again at most this
# often. A provider once set stays set (OpenTelemetry sets it once).
LOOK_EVERY = 1.0
_set = False
_next_look = 0.0


def active() -> bool:
    """Whether spans are recorded: the API is installed and a real tracer provider is set (seen within a second)."""
    global _set, _next_look
    if _set:
        return True
    if trace is None:
        return False
    now = time.monotonic()
    if now < _next_look:
        return False
    provider = trace.get_tracer_provider()
    _set = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    _next_look = now + LOOK_EVERY
    return _set


def _ids(written: Any) -> list[Any]:
    jobs: Iterable[Any] = written if isinstance(written, list) else [written]
    return [job.pk for job in jobs if job is not None and job.pk is not None]


def enqueued(name: str, write: Callable[..., T], *args: Any) -> T:
    """``write(*args)`` (enqueueing job ``name``); when tracing, in a PRODUCER span whose context is stored on the rows.

    The rows and their context commit together, so no worker can claim a row before
    its context is there.
    """
    if not active():
        return write(*args)
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(f"enqueue {name}", kind=trace.SpanKind.PRODUCER) as span:
        span.set_attribute("messaging.system", "axa_django")
        span.set_attribute("messaging.operation.type", "send")
        span.set_attribute("axa_django.job.name", name)
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        using = conf.queue_database()
        with transaction.atomic(using=using):
            written = write(*args)
            ids = _ids(written)
            if carrier and ids:
                with connections[using].cursor() as cursor:
                    cursor.execute(RECORD, [json.dumps(carrier), ids])
        if len(ids) == 1:
            span.set_attribute("axa_django.job.id", str(ids[0]))
        span.set_attribute("axa_django.jobs", len(ids))
        return written


def _stored(job_id: Any) -> tuple[dict[str, str], str | None]:
    """The carrier and queue stored on the row (empty when none, unreadable or the row is gone)."""
    connection = connections[conf.get("DATABASE")]
    try:
        # A savepoint inside the caller's transaction (immediate mode): a failure must not abort it.
        guard = transaction.atomic(using=connection.alias) if connection.in_atomic_block else contextlib.nullcontext()
        with guard, connection.cursor() as cursor:
            cursor.execute(READ, [job_id])
            row = cursor.fetchone()
    except DatabaseError:
        return {}, None
    if row is None:
        return {}, None
    text, queue = row
    try:
        carrier = json.loads(text) if text else {}
    except ValueError:
        carrier = {}
    if not isinstance(carrier, dict):
        carrier = {}
    return {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}, queue


def traced(perform: F) -> F:
    """Wrap ``execution.perform``: each attempt runs in a CONSUMER span, child of and linked to its enqueue."""
    if trace is None:
        return perform

    @functools.wraps(perform)
    def run(job: Any, worker_id: Any, resolve: Any) -> Any:
        if not active():
            return perform(job, worker_id, resolve)
        carrier, queue = _stored(job.id)
        parent = propagate.extract(carrier) if carrier else None
        origin = trace.get_current_span(parent).get_span_context() if parent is not None else None
        links = [trace.Link(origin)] if origin is not None and origin.is_valid else []
        tracer = trace.get_tracer(TRACER)
        with tracer.start_as_current_span(
            f"run {job.name}", context=parent, kind=trace.SpanKind.CONSUMER, links=links
        ) as span:
            span.set_attribute("messaging.system", "axa_django")
            span.set_attribute("messaging.operation.type", "process")
            span.set_attribute("axa_django.job.name", job.name)
            span.set_attribute("axa_django.job.id", str(job.id))
            span.set_attribute("axa_django.job.attempt", int(job.attempt))
            if queue is not None:
                span.set_attribute("axa_django.job.queue", queue)
            if worker_id is not None:
                span.set_attribute("axa_django.worker.id", str(worker_id))
            outcome = perform(job, worker_id, resolve)
            span.set_attribute("axa_django.job.outcome", outcome.status)
            if outcome.status != "completed":
                span.set_status(trace.Status(trace.StatusCode.ERROR, _described(outcome)))
            return outcome

    return run  # type: ignore[return-value]


def _described(outcome: Any) -> str:
    """``Type: message`` of a failed attempt, from its errors entry."""
    try:
        entry = json.loads(outcome.entry or "{}")
    except ValueError:
        entry = {}
    if not isinstance(entry, dict) or not entry.get("message"):
        return str(outcome.status)
    return f"{entry.get('type', 'Error')}: {entry['message']}"[:500]
