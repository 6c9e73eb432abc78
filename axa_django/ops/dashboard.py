"""The queue dashboard's figures, read with the database clock, and its server-rendered SVG chart."""

from __future__ import annotations

import datetime
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DatabaseError, connections, transaction
from django.http import JsonResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import conf
from ..models import Job
from . import fleetstats

logger = logging.getLogger("axa_django")

# Seconds between the live dashboard's refreshes (paused while its tab is hidden).
REFRESH_SECONDS = 5


# The database's now, how many jobs are ready, and how long the oldest has waited
# (served by the partial index axa_queue_ready).
READY = """
SELECT now(), count(*), now() - min(run_at)
FROM ONLY axa_queue WHERE status = 'queued' AND run_at <= now()
"""

# The chart's hours: the last 24 whole hours in UTC, the current one last. A past hour is
# counted once, SETTLE after it ended, into axa_finished_hour; only the hours not kept yet
# (the current one, mostly) are counted from the history. Counting the whole day at each
# page load read every job finished in it: 215 ms with 10,000,000 rows in the history.
# LATERAL: one index range per missing hour, and none when no hour is missing (a join
# was planned as a walk of the whole day, kept hours or not).
SETTLE = datetime.timedelta(minutes=5)  # a finish commits a moment after its finished_at
KEEP_HOURS = """
WITH hours AS (
    SELECT g.hour FROM generate_series(
        date_trunc('hour', now(), 'UTC') - interval '23 hours', date_trunc('hour', now(), 'UTC'), interval '1 hour'
    ) AS g(hour)
    WHERE g.hour + interval '1 hour' + %(settle)s <= now()
      AND NOT EXISTS (SELECT 1 FROM axa_finished_hour k WHERE k.hour = g.hour)
), forgotten AS (
    DELETE FROM axa_finished_hour WHERE hour < now() - interval '7 days'
)
INSERT INTO axa_finished_hour (hour, completed, failed)
SELECT h.hour, c.completed, c.failed
FROM hours h
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE q.status = 'completed') AS completed,
           count(*) FILTER (WHERE q.status = 'failed') AS failed
    FROM axa_queue q
    WHERE q.status IN ('completed', 'failed') AND q.finished_at >= h.hour AND q.finished_at < h.hour + interval '1 hour'
) AS c
ON CONFLICT (hour) DO NOTHING
"""
HOURLY = """
WITH hours AS (
    SELECT g.hour FROM generate_series(
        date_trunc('hour', now(), 'UTC') - interval '23 hours', date_trunc('hour', now(), 'UTC'), interval '1 hour'
    ) AS g(hour)
), live AS (
    SELECT date_trunc('hour', finished_at, 'UTC') AS hour,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status = 'failed') AS failed
    FROM axa_queue
    WHERE status IN ('completed', 'failed')
      AND finished_at >= (
          SELECT min(h.hour) FROM hours h WHERE NOT EXISTS (SELECT 1 FROM axa_finished_hour k WHERE k.hour = h.hour)
      )
      AND finished_at < date_trunc('hour', now(), 'UTC') + interval '1 hour'
    GROUP BY 1
)
SELECT h.hour, coalesce(k.completed, l.completed, 0), coalesce(k.failed, l.failed, 0)
FROM hours h
LEFT JOIN axa_finished_hour k ON k.hour = h.hour
LEFT JOIN live l ON l.hour = h.hour
ORDER BY h.hour
"""

# Registered workers, their heartbeat's age and how many jobs each is running.
WORKERS = """
SELECT w.id, w.hostname, w.pid, w.concurrency, w.queues, w.started_at, now() - w.heartbeat_at,
       (SELECT count(*) FROM ONLY axa_queue q WHERE q.status = 'running' AND q.worker_id = w.id)
FROM axa_worker w
ORDER BY w.started_at, w.id
"""


@dataclass
class Hour:
    """Jobs that finished in one hour."""

    start: datetime.datetime
    completed: int
    failed: int


@dataclass
class WorkerRow:
    """One row of ``axa_worker`` with its heartbeat's age."""

    id: uuid.UUID
    hostname: str
    pid: int
    concurrency: int
    queues: list[str]
    started_at: datetime.datetime
    heartbeat_age: datetime.timedelta
    running: int
    alive: bool


@dataclass
class Stats:
    """Everything the dashboard shows, read at one moment of the database clock."""

    now: datetime.datetime
    counts: dict[str, int]
    ready: int
    oldest_ready_age: datetime.timedelta | None
    hours: list[Hour] = field(default_factory=list)
    workers: list[WorkerRow] = field(default_factory=list)
    # Whether ``counts`` are the planner's estimates (a big table), not exact counts.
    counts_estimated: bool = False

    @property
    def total(self) -> int:
        """All rows in the table."""
        return sum(self.counts.values())


def collect(using: str | None = None) -> Stats:
    """Read the dashboard's figures from the queue database."""
    lease = datetime.timedelta(seconds=float(conf.get("LEASE_SECONDS")))
    using = using or conf.get("DATABASE")
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # One transaction, without JIT: on a big history the planner prices the chart's
        # hours high enough to compile them, which took 230 ms of a 1 ms statement.
        cursor.execute("SELECT set_config('jit', 'off', true)")
        # Exact on a small table; on a big history the planner's estimates (counting 10M
        # rows took 1.3 s a page load).
        found, estimated = fleetstats.status_totals(cursor)
        counts = {status: found.pop(status, 0) for status in Job.Status.values}
        counts.update(found)  # statuses written by other producers still show
        cursor.execute(READY)
        now, ready, oldest = cursor.fetchone()
        _keep_hours(cursor, using)
        cursor.execute(HOURLY)
        hours = [Hour(start, completed, failed) for start, completed, failed in cursor.fetchall()]
        cursor.execute(WORKERS)
        workers = [
            WorkerRow(id_, host, pid, conc, _json_list(queues), started, age, running, age <= lease)
            for id_, host, pid, conc, queues, started, age, running in cursor.fetchall()
        ]
    return Stats(now, counts, ready, oldest, hours, workers, counts_estimated=estimated)


def live_response() -> JsonResponse:
    """The live dashboard's figures as JSON (503 with the reason when the database cannot be read)."""
    started = time.perf_counter()
    try:
        snapshot = fleetstats.collect()
    except (DatabaseError, psycopg.Error) as error:
        text = " ".join(str(error).split()) or type(error).__name__
        return JsonResponse({"error": f"cannot read the queue database: {text}"}, status=503)
    return JsonResponse(live(snapshot, time.perf_counter() - started))


_KEEP_REFUSED: set[str] = set()  # aliases whose refusal was logged (a read-only user is refused at every load)


def _keep_hours(cursor: Any, using: str) -> None:
    # In a savepoint: a database user that may not write (or a lock timeout) costs the
    # page its shortcut, never the page itself or the request's transaction.
    try:
        with transaction.atomic(using=using):
            cursor.execute(KEEP_HOURS, {"settle": SETTLE})
    except DatabaseError as error:
        level = logging.DEBUG if using in _KEEP_REFUSED else logging.WARNING
        _KEEP_REFUSED.add(using)
        logger.log(level, "the dashboard could not keep its past hours' counts (it counts them each time): %s", error)


def _json_list(value: Any) -> list[str]:
    # Django's PostgreSQL backend hands raw cursors jsonb as text.
    if isinstance(value, str):
        value = json.loads(value)
    return [str(item) for item in value] if isinstance(value, list) else []


def chart_svg(hours: list[Hour], width: int = 720, height: int = 180) -> SafeString:
    """Stacked bars of completed and failed jobs per hour, as inline SVG."""
    left, right, top, bottom = 40, 8, 10, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((h.completed + h.failed for h in hours), default=0)
    scale = plot_h / peak if peak else 0.0
    slot = plot_w / max(len(hours), 1)
    bars: list[tuple[Any, ...]] = []
    labels: list[tuple[Any, ...]] = []
    for i, hour in enumerate(hours):
        x = left + i * slot + 1
        w = max(slot - 2, 1)
        # Naive with USE_TZ = False: already in TIME_ZONE, as Django reads it.
        local = timezone.localtime(hour.start) if timezone.is_aware(hour.start) else hour.start
        label = local.strftime("%H:00")
        ok_h = hour.completed * scale
        bad_h = hour.failed * scale
        tip = f"{local:%Y-%m-%d %H:00}: {hour.completed:,} completed, {hour.failed:,} failed"
        bars.append((f"{x:.1f}", f"{top + plot_h - ok_h:.1f}", f"{w:.1f}", f"{ok_h:.1f}", "axa-bar-ok", tip))
        bars.append(
            (f"{x:.1f}", f"{top + plot_h - ok_h - bad_h:.1f}", f"{w:.1f}", f"{bad_h:.1f}", "axa-bar-failed", tip)
        )
        if i % 3 == 0:
            labels.append((f"{x + w / 2:.1f}", height - 6, label))
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
        bars,
    )
    ticks = format_html_join("", '<text x="{}" y="{}" text-anchor="middle">{}</text>', labels)
    return format_html(
        '<svg class="axa-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        'role="img" aria-label="{aria}">'
        '<line x1="{l}" y1="{base}" x2="{r}" y2="{base}" class="axa-axis"/>'
        '<text x="{tx}" y="{ty}" text-anchor="end">{peak}</text>'
        '<text x="{tx}" y="{base}" text-anchor="end">0</text>'
        "{rects}{ticks}</svg>",
        w=width,
        h=height,
        aria=f"Jobs completed and failed per hour over the last {len(hours)} hours; peak {peak:,}",
        l=left,
        r=width - right,
        base=top + plot_h,
        tx=left - 4,
        ty=top + 10,
        peak=f"{peak:,}",
        rects=rects,
        ticks=ticks,
    )


def refresh_seconds(asked: str | None) -> int:
    """The page's refresh interval: ``?refresh=N`` (1 to 60 seconds) or REFRESH_SECONDS."""
    if asked is not None and asked.isascii() and asked.isdigit() and 1 <= int(asked) <= 60:
        return int(asked)
    return REFRESH_SECONDS


def live(snapshot: fleetstats.Snapshot, took: float | None = None) -> dict[str, Any]:
    """What the live dashboard's poll returns: the snapshot plus the totals its cards show."""
    data = snapshot.as_dict()
    data["ready"] = sum(q.ready for q in snapshot.queues)
    data["ready_capped"] = any(q.ready_capped for q in snapshot.queues)
    ages = [q.oldest_ready_seconds for q in snapshot.queues if q.oldest_ready_seconds is not None]
    data["oldest_ready_seconds"] = max(ages, default=None)
    data["refresh_seconds"] = REFRESH_SECONDS
    if took is not None:
        data["took_ms"] = round(took * 1000, 1)
    return data
