"""The Queues and Workers pages' figures, read at one moment of the database clock, and the worker's stop.

Every statement is an index descent, a range bounded by a cap or a time window, or a
read of a table as small as the fleet (axa_worker, axa_paused_queue, axa_queue_limit):
queued rows through ``axa_queue_ready_queue`` (one descent per queue, each count capped at CAP),
running rows through ``axa_queue_running``, finished rows through ``axa_queue_finished``
backwards from now, at most THROUGHPUT_CAP of them, in axa_queue and every history table.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from .. import conf, registry
from ..selection import task_backend_aliases
from ..sql import LIVE
from . import fleetstats

# Ready and scheduled rows counted per queue: beyond this a figure reads "at least CAP".
CAP = fleetstats.CAP
# Throughput: rows finished in the last WINDOW, at most THROUGHPUT_CAP of them (the newest).
# Past the cap the rate is taken over the span those rows cover: a busy fleet's last
# minutes are hundreds of thousands of rows, each a heap fetch for its queue.
WINDOW = datetime.timedelta(minutes=5)
THROUGHPUT_CAP = 10_000
# Running jobs listed on the Workers page (the longest-running first); the counts are exact.
RUNNING_LISTED = 1_000

# The queues that hold queued rows: a loose index scan of axa_queue_ready_queue, one
# descent per queue ("attempts >= 0" names that index; no claim says it), and those
# running rows are in.
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
"""

RUNNING = "SELECT queue, count(*) FROM ONLY axa_queue WHERE status = 'running' GROUP BY queue"

# The dashboard's per-queue counts (ready, scheduled, each capped; the oldest ready row's
# wait) on axa_queue alone: queued rows live nowhere else (a history row given a live status
# moves back), and an Append over every history table's empty index cost each counted row
# 15-25% more (100,000 queued: 52 ms against 60-68).
PER_QUEUE = fleetstats.PER_QUEUE.replace("FROM axa_queue", "FROM ONLY axa_queue")
assert PER_QUEUE.count("FROM ONLY axa_queue") == 3, "fleetstats.PER_QUEUE changed: read it again"

# Per queue: completed and failed among the newest rows finished within the window, and
# how many rows were read and the span they cover (the window, unless the cap cut it). One
# pass: a CTE read twice more for its totals spilled 50,000 rows to disk (125 ms, 75 without).
THROUGHPUT = """
SELECT queue, count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed'),
       sum(count(*)) OVER ()::int8, extract(epoch FROM now() - min(min(finished_at)) OVER ())::float8
FROM (
    SELECT queue, status, finished_at FROM axa_queue
    WHERE finished_at >= now() - %(window)s AND status IN ('completed', 'failed')
    ORDER BY finished_at DESC LIMIT %(cap)s
) AS recent GROUP BY queue
"""

PAUSES = """
SELECT queue, reason, paused_by, paused_at, extract(epoch FROM now() - paused_at)::float8 FROM axa_paused_queue
"""
LIMITS = "SELECT queue, max_running, set_by, set_at FROM axa_queue_limit"

# Every registered worker; live while its heartbeat is younger than its own lease (sql.LIVE:
# a lease written by hand as 1e12 or Infinity cannot put the page's arithmetic out of range).
WORKERS = f"""
SELECT id, hostname, pid, concurrency, queues, names, backends, started_at,
       extract(epoch FROM now() - started_at)::float8, extract(epoch FROM now() - heartbeat_at)::float8,
       {LIVE}, stop_requested_by, extract(epoch FROM now() - stop_requested_at)::float8
FROM axa_worker w ORDER BY started_at, id
"""

# The live workers' running rows: per worker how many, and how many of them started
# (a row claimed ahead waits for a free thread); then the rows, longest-running first.
RUNNING_BY_WORKER = """
SELECT worker_id, count(*), count(started_at) FROM ONLY axa_queue
WHERE status = 'running' AND worker_id = ANY(%(workers)s::uuid[]) GROUP BY worker_id
"""
RUNNING_JOBS = """
SELECT worker_id, id, name, queue, attempts, started_at, extract(epoch FROM now() - started_at)::float8
FROM ONLY axa_queue WHERE status = 'running' AND worker_id = ANY(%(workers)s::uuid[])
ORDER BY started_at NULLS LAST, id LIMIT %(limit)s
"""

# Ask one live worker to stop: its next heartbeat reads the request back (sql.HEARTBEAT).
# A request already made stands (the first asker is the one the worker names). The time is
# the write's own, after any beat it waited for: every beat later than it reads the request.
STOP = f"""
UPDATE axa_worker w SET stop_requested_by = %(by)s, stop_requested_at = clock_timestamp()
WHERE id = %(worker)s AND stop_requested_by IS NULL AND {LIVE}
RETURNING hostname, pid
"""
# Why a stop was not asked: the worker is gone, its lease ran out, or someone asked before.
STOP_REFUSED = f"""
SELECT hostname, pid, {LIVE}, stop_requested_by
FROM axa_worker w WHERE id = %(worker)s
"""


@dataclass
class QueueRow:
    """One queue's figures and state."""

    queue: str
    ready: int = 0
    ready_capped: bool = False
    scheduled: int = 0
    scheduled_capped: bool = False
    running: int = 0
    oldest_ready_seconds: float | None = None
    completed: int = 0  # finished in the throughput's span
    failed: int = 0
    per_minute: float = 0.0
    paused: bool = False
    reason: str = ""
    paused_by: str = ""
    paused_at: datetime.datetime | None = None
    paused_seconds: float | None = None
    max_running: int | None = None
    limit_set_by: str = ""
    workers: list[str] = field(default_factory=list)  # the live workers that claim from it, as host:pid


@dataclass
class Queues:
    """The Queues page: every queue, and the span its throughput was counted over."""

    queues: list[QueueRow]
    span_seconds: float  # the window, or less when THROUGHPUT_CAP rows cut it
    span_capped: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: what the page's poll returns."""
        return asdict(self)


@dataclass
class RunningJob:
    """A running job as the Workers page lists it."""

    id: str
    name: str
    queue: str
    attempt: int
    started_at: datetime.datetime | None  # None: claimed ahead, waiting for a free thread
    seconds: float | None


@dataclass
class WorkerRow:
    """One live worker, with what it runs."""

    id: str
    hostname: str
    pid: int
    concurrency: int
    queues: list[str]
    names: list[str]
    backends: list[str]
    started_at: datetime.datetime
    uptime: float
    heartbeat_age: float
    stop_requested_by: str | None
    stop_requested_seconds: float | None
    running: int = 0  # its running rows, the ones claimed ahead included
    busy: int = 0  # threads running a job now
    jobs: list[RunningJob] = field(default_factory=list)


@dataclass
class Workers:
    """The Workers page: live workers, and how many rows are left of dead ones."""

    workers: list[WorkerRow]
    dead: int  # rows whose lease ran out: the next rescue deletes them and queues their jobs again
    listed_all: bool  # False: more running jobs than RUNNING_LISTED, the longest-running listed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: what the page's poll returns."""
        return asdict(self)


def _json_list(value: Any) -> list[str]:
    # Django's PostgreSQL backend hands raw cursors jsonb as text.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(item) for item in value] if isinstance(value, list) else []


def _finite(value: float | None) -> float | None:
    # A time at the edge of the range (another producer's 'infinity') has no age to show.
    return value if value is not None and math.isfinite(value) else None


def configured_queues() -> set[str]:
    """Queues named in code: registered jobs' default queues and the task backends' QUEUES."""
    names = {job.options.queue for job in registry.registry.values()}
    tasks = getattr(settings, "TASKS", {})
    for alias in task_backend_aliases():
        names.update(tasks[alias].get("QUEUES", ["default"]))  # django.tasks' own default
    return names


def _read(using: str | None) -> Any:
    alias = using or conf.get("DATABASE")
    return alias, connections[alias].in_atomic_block


def _bounded(cursor: Any, outer: bool) -> None:
    if not outer:
        # Transaction-local: inside the caller's transaction (ATOMIC_REQUESTS) it would outlive us.
        cursor.execute(fleetstats.TIMEOUT, [fleetstats.STATEMENT_TIMEOUT])


def queues(using: str | None = None) -> Queues:
    """Every queue with rows, a pause, a limit, a live worker or a name in code, with its figures."""
    alias, outer = _read(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        _bounded(cursor, outer)
        cursor.execute(QUEUE_NAMES, {"queues": fleetstats.QUEUES})
        names = {str(name) for (name,) in cursor.fetchall() if name is not None}
        cursor.execute(THROUGHPUT, {"window": WINDOW, "cap": THROUGHPUT_CAP})
        finished = {str(q): (int(ok), int(bad), int(read), span) for q, ok, bad, read, span in cursor.fetchall()}
        cursor.execute(PAUSES)
        pauses = {str(row[0]): row for row in cursor.fetchall()}
        cursor.execute(LIMITS)
        limits = {str(row[0]): row for row in cursor.fetchall()}
        live = [w for w in _workers(cursor) if w[1]]
        names |= set(finished) | set(pauses) | set(limits) | configured_queues()
        names |= {queue for _, _, served in live for queue in served}
        rows = {name: QueueRow(name) for name in sorted(names)}
        cursor.execute(PER_QUEUE, {"queues": list(rows), "cap": CAP})
        for name, ready, scheduled, oldest in cursor.fetchall():
            row = rows[name]
            row.ready, row.scheduled, row.oldest_ready_seconds = int(ready), int(scheduled), _finite(oldest)
            row.ready_capped, row.scheduled_capped = ready >= CAP, scheduled >= CAP
        cursor.execute(RUNNING)
        for name, count in cursor.fetchall():
            if name in rows:
                rows[name].running = int(count)
    read, span = next(((r, s) for _, _, r, s in finished.values()), (0, None))
    capped = read >= THROUGHPUT_CAP and span is not None
    seconds = max(float(span), 1.0) if capped else WINDOW.total_seconds()
    for name, row in rows.items():
        row.completed, row.failed = finished.get(name, (0, 0, 0, 0))[:2]
        row.per_minute = (row.completed + row.failed) * 60 / seconds
        if name in pauses:
            _, reason, by, at, age = pauses[name]
            row.paused, row.reason, row.paused_by, row.paused_at, row.paused_seconds = True, reason, by, at, age
        if name in limits:
            row.max_running, row.limit_set_by = int(limits[name][1]), limits[name][2]
        row.workers = [label for label, _, served in live if not served or name in served]
    return Queues(list(rows.values()), seconds, capped)


def _workers(cursor: Any) -> list[tuple[str, bool, list[str]]]:
    """(host:pid, live, queues) of every registered worker (its queues empty: all)."""
    cursor.execute(f"SELECT hostname, pid, {LIVE}, queues FROM axa_worker w ORDER BY started_at, id")
    return [(f"{host}:{pid}", bool(alive), _json_list(served)) for host, pid, alive, served in cursor.fetchall()]


def workers(using: str | None = None) -> Workers:
    """Every live worker with its running jobs, and how many dead rows wait for the rescue."""
    alias, outer = _read(using)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        _bounded(cursor, outer)
        cursor.execute(WORKERS)
        live, dead = [], 0
        for row in cursor.fetchall():
            id_, host, pid, conc, served, names, backends, started, up, age, alive, stop_by, stop_age = row
            if not alive:
                dead += 1
                continue
            live.append(
                WorkerRow(
                    str(id_),
                    host,
                    pid,
                    conc,
                    _json_list(served),
                    _json_list(names),
                    _json_list(backends),
                    started,
                    up,
                    age,
                    stop_by,
                    max(stop_age, 0.0) if stop_age is not None else None,  # asked after this read began: just now
                )
            )
        by_id = {w.id: w for w in live}
        listed = 0
        if live:
            cursor.execute(RUNNING_BY_WORKER, {"workers": list(by_id)})
            for worker_id, running, started in cursor.fetchall():
                by_id[str(worker_id)].running, by_id[str(worker_id)].busy = int(running), int(started)
            cursor.execute(RUNNING_JOBS, {"workers": list(by_id), "limit": RUNNING_LISTED})
            for worker_id, job_id, name, queue, attempt, started, seconds in cursor.fetchall():
                job = RunningJob(str(job_id), name, queue, int(attempt), started, _finite(seconds))
                by_id[str(worker_id)].jobs.append(job)
                listed += 1
    return Workers(live, dead, listed_all=listed == sum(w.running for w in live))


@dataclass(frozen=True)
class StopAnswer:
    """What asking a worker to stop did: ``asked``, or why not (``gone``, ``dead``, ``already`` by someone)."""

    outcome: str
    label: str = ""  # host:pid
    by: str = ""


def request_stop(worker_id: str, by: str, using: str | None = None) -> StopAnswer:
    """Ask the worker ``worker_id`` to stop gracefully; it does at its next heartbeat (a third of its lease)."""
    alias = using or conf.get("DATABASE")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(STOP, {"worker": worker_id, "by": by})
        row = cursor.fetchone()
        if row is not None:
            return StopAnswer("asked", f"{row[0]}:{row[1]}")
        cursor.execute(STOP_REFUSED, {"worker": worker_id})
        row = cursor.fetchone()
    if row is None:
        return StopAnswer("gone")
    host, pid, _, asked_by = row
    if asked_by is not None:
        return StopAnswer("already", f"{host}:{pid}", asked_by)
    return StopAnswer("dead", f"{host}:{pid}")  # its lease had run out when asked
