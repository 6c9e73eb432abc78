"""Run by tests/test_ops_tracing.py in a process of its own (the tracer provider is global, set once).

Sets up the OpenTelemetry SDK with its in-memory exporter, enqueues under a "request"
span, drains the queue with a real Worker (its threads, its connections), and prints
the finished spans and the rows' trace_context as JSON. With the argument ``tasks``
(Django >= 6.0) it enqueues django.tasks tasks through QueueBackend instead.
"""

import json
import sys

import django

django.setup()

from asgiref.sync import async_to_sync  # noqa: E402
from django.db import connection  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from axa_django import enqueue  # noqa: E402
from axa_django.worker import Worker  # noqa: E402
from tests.testapp import ops_jobs  # noqa: E402

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def jobs() -> dict:
    ids = {}
    with trace.get_tracer("web").start_as_current_span("GET /signup"):
        ids["ok"] = str(ops_jobs.nap.using(queue="mail").perform_later(0).id)
        ids["boom"] = str(ops_jobs.boom.perform_later().id)
        ids["many"] = [str(job.id) for job in ops_jobs.nap.perform_later_many([{"seconds": 0}, {"seconds": 0}])]
    ids["outside"] = str(enqueue("ops.sleep", seconds=0).id)
    with connection.cursor() as cursor:
        # Rows by other producers: context that is not a carrier must not stop the job.
        for odd in ('"garbage"', '{"traceparent": 5}', '{"traceparent": "00-zz-yy-01"}'):
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, trace_context) "
                "VALUES (gen_random_uuid(), 'ops.sleep', '{}', %s::jsonb) RETURNING id",
                [odd],
            )
            ids.setdefault("odd", []).append(str(cursor.fetchone()[0]))
    return ids


def tasks() -> dict:
    from tests.testapp import tasks  # django.tasks, or the backport on Django 5.2

    ids = {}
    with trace.get_tracer("web").start_as_current_span("GET /signup"):
        ids["add"] = tasks.add.enqueue(2, 3).id
        ids["async"] = async_to_sync(tasks.add.aenqueue)(4, 5).id
        ids["fail"] = tasks.fail.using(backend="retrying").enqueue("boom on purpose").id  # 3 attempts
        ids["job"] = str(ops_jobs.nap.perform_later(0).id)  # a background job of the same request, to compare
    ids["outside"] = tasks.add.enqueue(1).id
    return ids


ids = tasks() if sys.argv[1:] == ["tasks"] else jobs()
with connection.cursor() as cursor:
    cursor.execute("SELECT id::text, trace_context::text FROM axa_queue")
    stored = dict(cursor.fetchall())
code = Worker(concurrency=2, burst=True, install_signals=False).run()
with connection.cursor() as cursor:
    cursor.execute("SELECT id::text, status FROM axa_queue")
    statuses = dict(cursor.fetchall())


def span(s):
    return {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent": format(s.parent.span_id, "016x") if s.parent else None,
        "links": [format(link.context.span_id, "016x") for link in s.links],
        "attributes": dict(s.attributes),
        "status": s.status.status_code.name,
        "description": s.status.description,
    }


json.dump(
    {
        "code": code,
        "ids": ids,
        "stored": stored,
        "statuses": statuses,
        "spans": [span(s) for s in exporter.get_finished_spans()],
    },
    sys.stdout,
)
