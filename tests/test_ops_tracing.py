"""Tracing: enqueue stores the trace context on the row, the worker runs each job in a span linked to it (part 3)."""

import importlib.util
import json
import subprocess
import sys

import pytest
from django.db import connection

from axa_django.ops import tracing
from tests.conftest import AXA_APPS, ROOT
from tests.testapp import ops_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

HAS_API = importlib.util.find_spec("opentelemetry") is not None
needs_sdk = pytest.mark.skipif(
    not HAS_API or importlib.util.find_spec("opentelemetry.sdk") is None,
    reason="opentelemetry-sdk is not installed (pip install 'axa-django[tracing]' opentelemetry-sdk)",
)


needs_tasks = pytest.mark.skipif(
    importlib.util.find_spec("django.tasks") is None and importlib.util.find_spec("django_tasks") is None,
    reason="QueueBackend needs django.tasks (Django >= 6.0) or the django-tasks backport",
)


def traced_run(workers, *args: str) -> dict:
    """Run tests/ops_tracing_script.py with ``args``; its JSON output."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.ops_tracing_script", *args],  # from ROOT, as a module: tests is importable
        cwd=ROOT,
        env=workers.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["code"] == 0
    return out


@needs_sdk
def test_a_request_trace_shows_the_jobs_it_caused(workers):
    out = traced_run(workers)
    spans = out["spans"]
    (request,) = [s for s in spans if s["name"] == "GET /signup"]
    runs = {s["attributes"]["axa_django.job.id"]: s for s in spans if s["kind"] == "CONSUMER"}
    enqueues = {s["span_id"]: s for s in spans if s["kind"] == "PRODUCER"}
    # Every row written under the request carries a traceparent of the request's trace.
    for job_id in [out["ids"]["ok"], out["ids"]["boom"], *out["ids"]["many"]]:
        carrier = json.loads(out["stored"][job_id])
        assert carrier["traceparent"].split("-")[1] == request["trace_id"], carrier
        run = runs[job_id]
        enqueue = enqueues[run["parent"]]
        assert run["links"] == [run["parent"]] and run["trace_id"] == request["trace_id"]
        assert enqueue["parent"] == request["span_id"] and enqueue["attributes"]["messaging.operation.type"] == "send"
    ok = runs[out["ids"]["ok"]]
    assert ok["name"] == "run ops.sleep" and ok["status"] == "UNSET"
    assert {k: v for k, v in ok["attributes"].items() if k != "axa_django.worker.id"} == {
        "messaging.system": "axa_django",
        "messaging.operation.type": "process",
        "axa_django.job.name": "ops.sleep",
        "axa_django.job.id": out["ids"]["ok"],
        "axa_django.job.attempt": 1,
        "axa_django.job.queue": "mail",
        "axa_django.job.outcome": "completed",
    }
    boom = runs[out["ids"]["boom"]]
    assert boom["status"] == "ERROR" and boom["attributes"]["axa_django.job.outcome"] == "failed"
    assert "boom on purpose" in boom["description"]
    # One bulk enqueue is one span for all its rows.
    (bulk,) = {runs[i]["parent"] for i in out["ids"]["many"]}
    assert enqueues[bulk]["attributes"]["axa_django.jobs"] == 2
    # Enqueued outside any span: the enqueue span is a root, the job still joins its trace.
    outside = runs[out["ids"]["outside"]]
    assert enqueues[outside["parent"]]["parent"] is None and outside["trace_id"] != request["trace_id"]
    # Odd context written by another producer: the job runs, in a span of its own.
    for job_id in out["ids"]["odd"]:
        assert out["statuses"][job_id] == "completed" and runs[job_id]["parent"] is None and runs[job_id]["links"] == []
    assert set(out["statuses"].values()) == {"completed", "failed"}


@needs_sdk
@needs_tasks
def test_a_request_trace_shows_the_tasks_it_caused_as_it_does_jobs(workers):
    out = traced_run(workers, "tasks")
    spans = out["spans"]
    (request,) = [s for s in spans if s["name"] == "GET /signup"]
    enqueues = {s["span_id"]: s for s in spans if s["kind"] == "PRODUCER"}
    runs: dict[str, list[dict]] = {}
    for s in spans:
        if s["kind"] == "CONSUMER":
            runs.setdefault(s["attributes"]["axa_django.job.id"], []).append(s)
    ids = out["ids"]
    # Each task, enqueue() or aenqueue(), runs (every attempt) in a child of its enqueue
    # span, itself a child of the request's span: as the background job beside them does.
    for key, attempts in (("add", 1), ("async", 1), ("fail", 3), ("job", 1)):
        job_id = ids[key]
        assert out["stored"][job_id] is not None, f"{key}: no trace context on the row"
        assert json.loads(out["stored"][job_id])["traceparent"].split("-")[1] == request["trace_id"]
        assert len(runs[job_id]) == attempts, key
        (parent,) = {run["parent"] for run in runs[job_id]}
        enqueue = enqueues[parent]
        assert enqueue["parent"] == request["span_id"] and enqueue["trace_id"] == request["trace_id"], key
        assert enqueue["attributes"]["axa_django.job.id"] == job_id, key
        for run in runs[job_id]:
            assert run["trace_id"] == request["trace_id"] and run["links"] == [parent], key
    add = runs[ids["add"]][0]
    assert add["name"] == "run tests.testapp.tasks.add" and add["attributes"]["axa_django.job.outcome"] == "completed"
    assert enqueues[add["parent"]]["name"] == "enqueue tests.testapp.tasks.add"
    assert [run["status"] for run in runs[ids["fail"]]] == ["ERROR"] * 3
    # Enqueued outside any span: the enqueue span is a root, the task still joins its trace.
    (outside,) = runs[ids["outside"]]
    assert enqueues[outside["parent"]]["parent"] is None and outside["trace_id"] != request["trace_id"]
    assert out["statuses"] == {
        ids["add"]: "completed",
        ids["async"]: "completed",
        ids["fail"]: "failed",
        ids["job"]: "completed",
        ids["outside"]: "completed",
    }


def test_without_a_tracer_provider_nothing_is_written_or_read(django_assert_num_queries):
    assert not tracing.active()
    with django_assert_num_queries(1):  # the INSERT alone
        job = ops_jobs.nap.perform_later(0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT trace_context FROM axa_queue WHERE id = %s", [job.id])
        assert cursor.fetchone() == (None,)


@pytest.mark.skipif(HAS_API, reason="opentelemetry-api is installed here")
def test_without_opentelemetry_nothing_of_it_is_imported():
    assert tracing.trace is None and "opentelemetry" not in sys.modules
    assert tracing.traced(len) is len


LATE_PROVIDER = """
import time
import django
django.setup()
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from axa_django.ops import tracing
assert not tracing.active()
trace.set_tracer_provider(TracerProvider())
set_at = time.monotonic()
while not tracing.active():
    assert time.monotonic() - set_at < 10, "a provider set late was never seen"
    time.sleep(0.01)
print(f"{time.monotonic() - set_at:.2f}")
"""


@needs_sdk
def test_a_tracer_provider_set_after_the_first_look_is_seen_within_a_second(workers):
    # With no provider, OpenTelemetry is asked again at most once a second (each ask reads
    # os.environ); one set later, as a post-fork hook does, is seen by the next look.
    proc = subprocess.run(
        [sys.executable, "-c", LATE_PROVIDER], cwd=ROOT, env=workers.env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) <= tracing.LOOK_EVERY + 0.5, proc.stdout
