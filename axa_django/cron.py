"""Periodic jobs: cron expressions checked at decoration, enqueued by running workers.

Each scheduled job has a row in ``axa_schedule`` holding the scheduled time of the
last occurrence enqueued. A worker locks that row (``FOR UPDATE SKIP LOCKED``: if
another worker holds it, that worker is scheduling the job right now and this one
skips it), enqueues every occurrence after it up to now, and moves it forward, all in
one transaction, so each occurrence is enqueued once however many workers run and
however seldom they look. Catch-up is bounded: occurrences scheduled within
``CATCH_UP`` before now are all enqueued; older ones are dropped except the latest,
which is enqueued if nothing newer is (so after downtime a job runs once, not once per
missed occurrence). Each occurrence also carries the unique key ``cron:<time>``.
A schedule switched off (``set_enabled``, the admin's periodic jobs page) is skipped.
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone as django_timezone

from . import conf, registry
from .enqueuing import cronexpr, rows
from .models import Job

# Occurrences at most this old when a worker looks are all enqueued; older ones are
# dropped, except the latest when nothing newer is due.
CATCH_UP = datetime.timedelta(seconds=60)

# The schedule's row, locked for this transaction; no row back: absent, or another
# worker is scheduling this job right now.
LOCK = "SELECT last_run, enabled FROM axa_schedule WHERE name = %(name)s FOR UPDATE SKIP LOCKED"
ADVANCE = "UPDATE axa_schedule SET last_run = %(due)s, last_job_id = %(job)s WHERE name = %(name)s"
# Switched off from the admin: a schedule never seen is recorded as FIRST_SIGHT would, off.
DISABLE = """
INSERT INTO axa_schedule (name, last_run, enabled) VALUES (%(name)s, %(due)s, false)
ON CONFLICT (name) DO UPDATE SET enabled = false WHERE axa_schedule.enabled
RETURNING name
"""
# Switched on again: the occurrences missed while off are skipped (last_run moves to the
# latest one due), so the job next runs at its next occurrence, as a newly deployed one.
ENABLE = """
UPDATE axa_schedule SET enabled = true, last_run = GREATEST(last_run, %(due)s)
WHERE name = %(name)s AND NOT enabled
RETURNING name
"""
# First sight of a schedule: remember the latest occurrence without running it. The
# NOT EXISTS reads the committed row without waiting, where ON CONFLICT alone would
# wait for a worker that holds the row locked and has just moved it forward.
FIRST_SIGHT = """
INSERT INTO axa_schedule (name, last_run)
SELECT %(name)s, %(due)s WHERE NOT EXISTS (SELECT 1 FROM axa_schedule WHERE name = %(name)s)
ON CONFLICT (name) DO NOTHING
"""


def timezone() -> zoneinfo.ZoneInfo:
    """The time zone cron expressions are read in: CRON_TIMEZONE, else TIME_ZONE, else UTC."""
    return zoneinfo.ZoneInfo(conf.get("CRON_TIMEZONE") or settings.TIME_ZONE or "UTC")


def next_runs(
    job: registry.JobFunction[Any, Any], n: int = 1, after: datetime.datetime | None = None
) -> list[datetime.datetime]:
    """The next ``n`` scheduled times of ``job`` after ``after`` (default: now), in the cron time zone."""
    if job.cron is None:
        return []
    start = (after or datetime.datetime.now(datetime.UTC)).astimezone(timezone())
    it = cronexpr.load()(job.cron, start)
    return [it.get_next(datetime.datetime) for _ in range(n)]


def due(job: registry.JobFunction[Any, Any], now: datetime.datetime) -> datetime.datetime:
    """The latest scheduled time of ``job`` at or before ``now``."""
    start = now.astimezone(timezone()) + datetime.timedelta(microseconds=1)  # get_prev is strict
    return cronexpr.load()(job.cron, start).get_prev(datetime.datetime)


def occurrences(
    job: registry.JobFunction[Any, Any], last_run: datetime.datetime, now: datetime.datetime
) -> list[datetime.datetime]:
    """The occurrences of ``job`` to enqueue after ``last_run`` up to ``now``, oldest first.

    Those scheduled within ``CATCH_UP`` before ``now``; if there are none, only the latest.
    """
    latest = due(job, now)
    if latest <= last_run:
        return []
    # Start the walk at the window, not at last_run: a week of downtime of a
    # per-second job must not walk 600,000 occurrences to drop them.
    it = cronexpr.load()(job.cron, max(last_run, now - CATCH_UP).astimezone(timezone()))
    found = []
    while (when := it.get_next(datetime.datetime)) <= now:
        found.append(when)
    return found or [latest]


def seconds_until_next(jobs: Iterable[registry.JobFunction[Any, Any]], now: datetime.datetime) -> float | None:
    """Seconds from ``now`` to the earliest next occurrence of ``jobs``; None without jobs."""
    upcoming = [next_runs(job, 1, after=now)[0] for job in jobs if job.cron is not None]
    return min(upcoming).timestamp() - now.timestamp() if upcoming else None


def unique_key(when: datetime.datetime) -> str:
    """The unique key of the occurrence scheduled at ``when``."""
    return "cron:" + when.astimezone(datetime.UTC).isoformat()


def scheduled_jobs(
    names: Iterable[str] | None = None, queues: Iterable[str] | None = None
) -> list[registry.JobFunction[Any, Any]]:
    """Registered periodic jobs, limited to ``names`` and ``queues`` when given."""
    wanted = set(names) if names is not None else None
    queue_set = set(queues) if queues else None
    return [
        job
        for name, job in sorted(registry.registry.items())
        if job.cron is not None
        and (wanted is None or name in wanted)
        and (queue_set is None or job.options.queue in queue_set)
    ]


def aware(value: datetime.datetime) -> datetime.datetime:
    """A time read through Django's connection, made aware: with USE_TZ = False it is naive, in TIME_ZONE."""
    if value.utcoffset() is None:
        return django_timezone.make_aware(value, django_timezone.get_default_timezone())
    return value


def schedule(
    now: datetime.datetime | None = None,
    *,
    names: Iterable[str] | None = None,
    queues: Iterable[str] | None = None,
) -> list[Job]:
    """Enqueue every due occurrence not yet enqueued by any worker; return the jobs written.

    ``now`` (aware) defaults to the database clock. Each job's schedule is handled in
    its own transaction (a savepoint inside the caller's). A schedule seen for the
    first time only records its latest occurrence, so deploying a job does not run it
    at once. See the module docstring for the catch-up rule.
    """
    if now is not None and now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    jobs = scheduled_jobs(names, queues)
    if not jobs:
        return []
    # The queue database, where rows.write inserts: the schedule's row must share its transaction.
    using = conf.get("DATABASE")
    if now is None:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT now()")
            now = aware(cursor.fetchone()[0])
    written = []
    for job in jobs:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(LOCK, {"name": job.name})
            row = cursor.fetchone()
            if row is None:
                # Absent: record it. Present but locked: another worker is on it; skip.
                cursor.execute(FIRST_SIGHT, {"name": job.name, "due": due(job, now)})
                continue
            if not row[1]:
                continue  # disabled (set_enabled): last_run stays, and ENABLE moves it past what was missed
            whens = occurrences(job, aware(row[0]), now)
            these = []
            for when in whens:
                options = replace(job.options, run_at=when, unique_key=unique_key(when), on_duplicate="return")
                these.append(rows.write(job.name, {}, options, job))
            if these:
                cursor.execute(ADVANCE, {"name": job.name, "due": whens[-1], "job": these[-1].pk})
            written += these
    return written


def set_enabled(job: registry.JobFunction[Any, Any], enabled: bool) -> bool:
    """Switch the periodic ``job`` on or off for every worker; return whether it changed.

    Off, no worker enqueues its occurrences. Switched on again, it next runs at its next
    occurrence: those missed while it was off are not caught up.
    """
    if job.cron is None:
        raise ValueError(f"job {job.name!r} is not a periodic job (it has no cron=)")
    using = conf.get("DATABASE")
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute("SELECT now()")
        now = aware(cursor.fetchone()[0])
        cursor.execute(ENABLE if enabled else DISABLE, {"name": job.name, "due": due(job, now)})
        return cursor.fetchone() is not None
