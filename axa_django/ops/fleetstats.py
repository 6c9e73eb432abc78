"""The queue's figures at one moment of the database clock: per queue, per worker, per minute.

Read by ``jobhealth`` (its reasons and ``--json``), the metrics view and the live
dashboard. Every statement is an index descent or a scan bounded by a cap or a time
window: ready rows per queue through ``axa_queue_ready_queue``, finished rows through
``axa_queue_finished``, running rows through ``axa_queue_running``; totals by status
are the planner's estimates once the table is large.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import connections, transaction

from .. import conf
from ..sql import refused

# Ready (and scheduled) rows counted per queue: beyond this the figure reads "at least CAP".
CAP = 100_000
# Below this many rows, totals by status are counted exactly; above, estimated.
EXACT_BELOW = 200_000
# Distinct queues looked at, each one index descent.
QUEUES = 1_000
# Running jobs listed with their workers.
RUNNING_LISTED = 500
# No figure may hold the probe or the page longer than this.
STATEMENT_TIMEOUT = "5s"

TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"

# The clock, and the queues that hold queued rows (a loose index scan: one descent per
# queue), running rows, rows finished in the last 5 minutes, or live workers.
QUEUE_NAMES = """
WITH RECURSIVE queued AS (
    (SELECT 1 AS n, queue FROM ONLY axa_queue WHERE status = 'queued' AND attempts >= 0 ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue FROM queued p CROSS JOIN LATERAL (
        SELECT queue FROM ONLY axa_queue WHERE status = 'queued' AND attempts >= 0 AND queue > p.queue
        ORDER BY queue LIMIT 1
    ) AS x WHERE p.n < %(queues)s
)
SELECT queue FROM queued
UNION SELECT queue FROM ONLY axa_queue WHERE status = 'running'
UNION SELECT queue FROM axa_queue WHERE finished_at >= now() - interval '5 minutes'
"""

# Per queue: ready and scheduled rows (each at most %(cap)s), the oldest ready row's wait.
# "attempts >= 0" selects axa_queue_ready_queue (claims never say it); a row written by
# SQL with negative attempts is left out of the figures.
# A run_at of '-infinity' (another producer's row) reads as 100 years, not an error.
PER_QUEUE = """
SELECT q.queue,
    (SELECT count(*) FROM (SELECT 1 FROM ONLY axa_queue WHERE status = 'queued' AND attempts >= 0 AND queue = q.queue
                           AND run_at <= now() LIMIT %(cap)s) AS c),
    (SELECT count(*) FROM (SELECT 1 FROM ONLY axa_queue WHERE status = 'queued' AND attempts >= 0 AND queue = q.queue
                           AND run_at > now() LIMIT %(cap)s) AS c),
    (SELECT CASE WHEN min(run_at) IS NOT NULL
                 THEN extract(epoch FROM now() - GREATEST(min(run_at), now() - interval '100 years'))::float8 END
     FROM ONLY axa_queue WHERE status = 'queued' AND attempts >= 0 AND queue = q.queue AND run_at <= now())
FROM unnest(%(queues)s::text[]) AS q(queue)
"""

PAUSED = "SELECT queue FROM axa_paused_queue"

RUNNING = "SELECT queue, count(*) FROM ONLY axa_queue WHERE status = 'running' GROUP BY queue"

# Finished in the last 5 minutes and the last minute, per queue and status, with the
# attempts those jobs took, and how long they waited to be claimed and took to run.
FINISHED = """
SELECT queue, status,
    count(*),
    count(*) FILTER (WHERE finished_at >= now() - interval '1 minute'),
    coalesce(sum(attempts) FILTER (WHERE finished_at >= now() - interval '1 minute'), 0),
    coalesce(sum(extract(epoch FROM started_at - run_at))
             FILTER (WHERE finished_at >= now() - interval '1 minute' AND started_at >= run_at), 0)::float8,
    count(*) FILTER (WHERE finished_at >= now() - interval '1 minute' AND started_at >= run_at),
    coalesce(sum(extract(epoch FROM finished_at - started_at))
             FILTER (WHERE finished_at >= now() - interval '1 minute' AND finished_at >= started_at), 0)::float8,
    count(*) FILTER (WHERE finished_at >= now() - interval '1 minute' AND finished_at >= started_at)
FROM axa_queue
WHERE finished_at >= now() - interval '5 minutes' AND status IN ('completed', 'failed')
GROUP BY queue, status
"""

# Each table's size as the planner sees it, scaled to its pages now, and how often each
# status appears in the column's statistics: axa_queue and each history table that
# inherits it, apart (axa_queue's own figures say nothing of its children's rows).
ESTIMATE = """
SELECT c.oid::regclass::text,
       CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN -1
            ELSE c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int8)
       END::float8,
       s.most_common_vals::text, s.most_common_freqs
FROM pg_class c
LEFT JOIN pg_stats s ON s.schemaname = c.relnamespace::regnamespace::text
    AND s.tablename = c.relname AND s.attname = 'status' AND NOT s.inherited
WHERE c.oid = 'axa_queue'::regclass
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass)
ORDER BY c.oid
"""

# One table's rows by status, counted (its name as the catalog quotes it: regclass output).
EXACT = "SELECT status, count(*) FROM ONLY {table} GROUP BY status"

WORKERS = """
SELECT w.id, w.hostname, w.pid, w.concurrency, w.queues, w.names,
       extract(epoch FROM now() - w.heartbeat_at)::float8, extract(epoch FROM now() - w.started_at)::float8
FROM axa_worker w ORDER BY w.started_at, w.id
"""

# The longest-running jobs first, with the worker that runs each (NULL: a seed claim).
CURRENT = """
SELECT id, name, queue, worker_id, attempts, extract(epoch FROM now() - started_at)::float8
FROM ONLY axa_queue WHERE status = 'running' ORDER BY started_at NULLS LAST LIMIT %(limit)s
"""


@dataclass
class QueueStats:
    """One queue's figures."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    oldest_ready_seconds: float | None = None
    completed_5m: int = 0
    failed_5m: int = 0
    completed_1m: int = 0
    failed_1m: int = 0
    attempts_1m: int = 0
    ready_capped: bool = False
    paused: bool = False  # no worker claims from it until resumed (axa_django.queues)

    @property
    def throughput_per_minute(self) -> float:
        """Jobs finished (completed or failed) per minute over the last 5 minutes."""
        return (self.completed_5m + self.failed_5m) / 5


@dataclass
class RunningJob:
    """A job running now."""

    id: str
    name: str
    queue: str
    attempt: int
    seconds: float | None  # None: claimed ahead of a free thread, not started yet


@dataclass
class WorkerStats:
    """One row of ``axa_worker``: live while its heartbeat is younger than the lease."""

    id: str
    hostname: str
    pid: int
    concurrency: int
    queues: list[str]
    names: list[str]
    heartbeat_age: float
    uptime: float
    alive: bool
    late: bool
    jobs: list[RunningJob] = field(default_factory=list)

    @property
    def busy(self) -> int:
        """Threads running a job now (as far as the listed jobs tell): rows claimed ahead have not started."""
        return sum(1 for job in self.jobs if job.seconds is not None)

    def covers(self, queue: str) -> bool:
        """Whether this worker claims from ``queue``."""
        return not self.queues or queue in self.queues


@dataclass
class Snapshot:
    """Everything the probes, metrics and dashboard read, at one moment of the database clock."""

    lease: float
    statuses: dict[str, int]
    statuses_estimated: bool
    queues: list[QueueStats]
    workers: list[WorkerStats]
    claim_latency_seconds: float | None
    run_seconds: float | None
    unattributed_running: list[RunningJob] = field(default_factory=list)
    # Finished jobs left in axa_queue because the database refused their move into the
    # history (a user's foreign key or trigger; sql/refused.py).
    history_refused: int = 0

    @property
    def live_workers(self) -> list[WorkerStats]:
        """Workers whose lease is current."""
        return [w for w in self.workers if w.alive]

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-ready data (what ``jobhealth --json`` and the dashboard's poll send)."""
        data = asdict(self)
        for entry, queue in zip(data["queues"], self.queues, strict=True):
            entry["throughput_per_minute"] = queue.throughput_per_minute
        live = self.live_workers
        data["live_workers"] = len(live)
        data["threads"] = sum(w.concurrency for w in live)
        data["threads_busy"] = sum(w.busy for w in live)
        return data


def _json_list(value: Any) -> list[str]:
    # Django's PostgreSQL backend hands raw cursors jsonb as text.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(item) for item in value] if isinstance(value, list) else []


def status_totals(cursor: Any) -> tuple[dict[str, int], bool]:
    """Rows per status, and whether some are the planner's estimates (tables of EXACT_BELOW rows and more).

    Each table (axa_queue, each history table) is counted or estimated on its own.
    """
    cursor.execute(ESTIMATE)
    totals: dict[str, int] = {}
    estimated = False
    for table, rows_now, values, freqs in cursor.fetchall():
        if rows_now is None or rows_now < EXACT_BELOW or not values or not freqs:
            cursor.execute(EXACT.format(table=table))
            counted = {str(status): int(n) for status, n in cursor.fetchall()}
        else:
            # most_common_vals of a text column reads back as an array literal: '{completed,failed}'.
            names = [v.strip('"') for v in values.strip("{}").split(",")]
            counted = {name: round(rows_now * freq) for name, freq in zip(names, freqs, strict=False)}
            estimated = True
        for status, n in counted.items():
            totals[status] = totals.get(status, 0) + n
    return {status: n for status, n in totals.items() if n}, estimated


def collect(using: str | None = None, queues: list[str] | None = None) -> Snapshot:
    """Read the figures (a handful of bounded statements in one read-only transaction)."""
    lease = float(conf.get("LEASE_SECONDS"))
    alias = using or conf.get("DATABASE")
    outer = connections[alias].in_atomic_block
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        if not outer:
            # Transaction-local: inside the caller's transaction (ATOMIC_REQUESTS) it would outlive us.
            cursor.execute(TIMEOUT, [STATEMENT_TIMEOUT])
        statuses, estimated = status_totals(cursor)
        cursor.execute(QUEUE_NAMES, {"queues": QUEUES})
        names = sorted({str(name) for (name,) in cursor.fetchall() if name is not None})
        cursor.execute(WORKERS)
        workers = [
            WorkerStats(str(i), host, pid, conc, _json_list(qs), _json_list(ns), age, up, age <= lease, False)
            for i, host, pid, conc, qs, ns, age, up in cursor.fetchall()
        ]
        for worker in workers:
            # A worker beats every lease/3: two beats missed is late, before its lease runs out.
            worker.late = worker.heartbeat_age > 2 * lease / 3
        cursor.execute(PAUSED)
        paused = {str(name) for (name,) in cursor.fetchall()}
        names = sorted(set(names) | {q for w in workers if w.alive for q in w.queues} | set(queues or []) | paused)
        if queues is not None:
            names = [name for name in names if name in queues]
        by_queue = {name: QueueStats(name, paused=name in paused) for name in names}
        cursor.execute(PER_QUEUE, {"queues": names, "cap": CAP})
        for name, ready, scheduled, oldest in cursor.fetchall():
            stats = by_queue[name]
            stats.ready, stats.scheduled, stats.oldest_ready_seconds = int(ready), int(scheduled), oldest
            stats.ready_capped = ready >= CAP
        cursor.execute(RUNNING)
        for name, count in cursor.fetchall():
            if name in by_queue:
                by_queue[name].running = int(count)
        cursor.execute(FINISHED)
        waits = [0.0, 0, 0.0, 0]
        for name, status, in_5m, in_1m, attempts, wait, waited, ran, timed in cursor.fetchall():
            stats = by_queue.get(name)
            if stats is None:
                continue
            if status == "completed":
                stats.completed_5m, stats.completed_1m = int(in_5m), int(in_1m)
            else:
                stats.failed_5m, stats.failed_1m = int(in_5m), int(in_1m)
            stats.attempts_1m += int(attempts)
            waits = [waits[0] + wait, waits[1] + waited, waits[2] + ran, waits[3] + timed]
        if estimated and queues is None:
            # Rare statuses fall outside the planner's most common values: the live ones are
            # counted exactly above (through their partial indexes), so say those.
            statuses["running"] = sum(q.running for q in by_queue.values())
            if not any(q.ready_capped or q.scheduled >= CAP for q in by_queue.values()):
                statuses["queued"] = sum(q.ready + q.scheduled for q in by_queue.values())
        cursor.execute(refused.COUNT)
        history_refused = int(cursor.fetchone()[0])
        cursor.execute(CURRENT, {"limit": RUNNING_LISTED})
        by_worker = {w.id: w for w in workers}
        orphans = []
        for job_id, name, queue, worker_id, attempt, seconds in cursor.fetchall():
            job = RunningJob(str(job_id), name, queue, int(attempt), _finite(seconds))
            owner = by_worker.get(str(worker_id)) if worker_id is not None else None
            (owner.jobs if owner is not None else orphans).append(job)
    return Snapshot(
        lease=lease,
        statuses=statuses,
        statuses_estimated=estimated,
        queues=list(by_queue.values()),
        workers=workers,
        claim_latency_seconds=waits[0] / waits[1] if waits[1] else None,
        run_seconds=waits[2] / waits[3] if waits[3] else None,
        unattributed_running=orphans,
        history_refused=history_refused,
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
