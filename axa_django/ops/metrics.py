"""The queue's figures in the Prometheus text format, built with ``prometheus_client`` (the ``metrics`` extra).

Without ``prometheus_client`` nothing of it is imported and ``INSTALL`` says how to get it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from . import fleetstats

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # the optional extra is not installed
    prometheus_client = None  # type: ignore[assignment]

INSTALL = (
    "The metrics view needs prometheus_client, which is not installed: pip install 'axa-django[metrics]' "
    "(or pip install prometheus_client), then restart the web process."
)


def available() -> bool:
    """Whether prometheus_client can be imported."""
    return prometheus_client is not None


class _Collector:
    """One scrape's metrics, from one snapshot."""

    def __init__(self, snapshot: fleetstats.Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        s = self.snapshot
        estimated = "true" if s.statuses_estimated else "false"
        jobs = GaugeMetricFamily(
            "axa_jobs",
            "Jobs in axa_queue by status (estimated from the planner's statistics when large)",
            labels=["status", "estimated"],
        )
        for status, count in sorted(s.statuses.items()):
            jobs.add_metric([status, estimated], count)
        yield jobs
        queue_jobs = GaugeMetricFamily(
            "axa_queue_jobs",
            f"Jobs per queue: ready (due now), scheduled (due later), running; counts stop at {fleetstats.CAP}",
            labels=["queue", "state"],
        )
        oldest = GaugeMetricFamily(
            "axa_queue_oldest_ready_seconds", "How long the oldest ready job of the queue has waited", labels=["queue"]
        )
        finished = GaugeMetricFamily(
            "axa_queue_finished_last_minute", "Jobs that finished in the last minute", labels=["queue", "status"]
        )
        attempts = GaugeMetricFamily(
            "axa_queue_attempts_last_minute",
            "Attempts taken by the jobs that finished in the last minute",
            labels=["queue"],
        )
        for q in s.queues:
            for state, value in (("ready", q.ready), ("scheduled", q.scheduled), ("running", q.running)):
                queue_jobs.add_metric([q.queue, state], value)
            oldest.add_metric([q.queue], q.oldest_ready_seconds or 0.0)
            finished.add_metric([q.queue, "completed"], q.completed_1m)
            finished.add_metric([q.queue, "failed"], q.failed_1m)
            attempts.add_metric([q.queue], q.attempts_1m)
        yield from (queue_jobs, oldest, finished, attempts)
        live = s.live_workers
        yield GaugeMetricFamily("axa_workers_live", "Workers whose heartbeat is within the lease", value=len(live))
        yield GaugeMetricFamily(
            "axa_worker_threads", "Job threads of the live workers", value=sum(w.concurrency for w in live)
        )
        yield GaugeMetricFamily(
            "axa_worker_threads_busy",
            "Job threads of the live workers running a job now",
            value=sum(w.busy for w in live),
        )
        beat = GaugeMetricFamily(
            "axa_worker_heartbeat_age_seconds",
            "Seconds since each registered worker's last heartbeat",
            labels=["worker", "hostname"],
        )
        for w in s.workers:
            beat.add_metric([w.id, w.hostname], w.heartbeat_age)
        yield beat
        yield GaugeMetricFamily(
            "axa_jobs_history_refused",
            "Finished jobs kept in axa_queue because the database refused their move into the history",
            value=s.history_refused,
        )
        yield GaugeMetricFamily(
            "axa_claim_latency_seconds",
            "Mean wait from run_at to the claim of the jobs that finished in the last minute",
            value=s.claim_latency_seconds or 0.0,
        )
        yield GaugeMetricFamily(
            "axa_run_seconds",
            "Mean time from claim to finish (run and outcome written) of the jobs that finished in the last minute",
            value=s.run_seconds or 0.0,
        )


def exposition(snapshot: fleetstats.Snapshot) -> tuple[bytes, str]:
    """(body, content type) of one scrape."""
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(snapshot))  # type: ignore[arg-type]
    return prometheus_client.generate_latest(registry), prometheus_client.CONTENT_TYPE_LATEST
