"""Periodic jobs: cron expressions checked at decoration, enqueued by running workers.

Each scheduled job has a row in ``axa_schedule`` holding the scheduled time of the
last occurrence enqueued. A worker enqueues an occurrence only if it moves that row
forward (a compare-and-set in the same transaction as the enqueue), so each occurrence
is enqueued once however many workers run. After downtime only the latest missed
occurrence is enqueued.
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections, transaction

from . import conf, registry, rows

if TYPE_CHECKING:
    from .models import Job
    from .registry import JobFunction

# Moves the schedule forward only if no worker has enqueued this occurrence (or a later one).
ADVANCE = "UPDATE axa_schedule SET last_run = %(due)s WHERE name = %(name)s AND last_run < %(due)s RETURNING name"
# First sight of a schedule: remember the latest occurrence without running it.
FIRST_SIGHT = "INSERT INTO axa_schedule (name, last_run) VALUES (%(name)s, %(due)s) ON CONFLICT (name) DO NOTHING"


def _croniter() -> Any:
    try:
        from croniter import croniter
    except ImportError:
        raise ImportError("cron=... needs croniter: pip install 'axa-django[cron]'") from None
    return croniter


def check_schedule(job: JobFunction[Any, Any]) -> None:
    """Raise if ``job.cron`` is not a valid cron expression or the job needs arguments."""
    croniter = _croniter()
    if not isinstance(job.cron, str) or not croniter.is_valid(job.cron):
        raise ValueError(
            f"job {job.name!r}: cron={job.cron!r} is not a valid cron expression "
            "(5 fields 'minute hour day month weekday', or 6 with seconds last)"
        )
    required = [
        p.name
        for p in job.signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"job {job.name!r} has cron={job.cron!r} but needs argument(s) {', '.join(required)}; "
            "a periodic job is called without arguments, so give them defaults"
        )


def timezone() -> zoneinfo.ZoneInfo:
    """The time zone cron expressions are read in: CRON_TIMEZONE, else TIME_ZONE, else UTC."""
    return zoneinfo.ZoneInfo(conf.get("CRON_TIMEZONE") or settings.TIME_ZONE or "UTC")


def next_runs(
    job: JobFunction[Any, Any], n: int = 1, after: datetime.datetime | None = None
) -> list[datetime.datetime]:
    """The next ``n`` scheduled times of ``job`` after ``after`` (default: now), in the cron time zone."""
    if job.cron is None:
        return []
    start = (after or datetime.datetime.now(datetime.UTC)).astimezone(timezone())
    it = _croniter()(job.cron, start)
    return [it.get_next(datetime.datetime) for _ in range(n)]


def due(job: JobFunction[Any, Any], now: datetime.datetime) -> datetime.datetime:
    """The latest scheduled time of ``job`` at or before ``now``."""
    start = now.astimezone(timezone()) + datetime.timedelta(microseconds=1)  # get_prev is strict
    return _croniter()(job.cron, start).get_prev(datetime.datetime)


def unique_key(when: datetime.datetime) -> str:
    """The unique key of the occurrence scheduled at ``when``."""
    return "cron:" + when.astimezone(datetime.UTC).isoformat()


def scheduled_jobs(
    names: Iterable[str] | None = None, queues: Iterable[str] | None = None
) -> list[JobFunction[Any, Any]]:
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


def schedule(
    now: datetime.datetime | None = None,
    *,
    names: Iterable[str] | None = None,
    queues: Iterable[str] | None = None,
) -> list[Job]:
    """Enqueue every due occurrence not yet enqueued by any worker; return the jobs written.

    ``now`` (aware) defaults to the database clock. A schedule seen for the first time
    only records its latest occurrence, so deploying a job does not run it at once.
    """
    if now is not None and now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    jobs = scheduled_jobs(names, queues)
    if not jobs:
        return []
    # The queue database, where rows.write inserts: the compare-and-set must share its transaction.
    using = conf.get("DATABASE")
    if now is None:
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
    written = []
    for job in jobs:
        when = due(job, now)
        params = {"name": job.name, "due": when}
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(ADVANCE, params)
            if cursor.fetchone() is None:
                cursor.execute(FIRST_SIGHT, params)
                continue
            options = replace(job.options, run_at=when, unique_key=unique_key(when), on_duplicate="return")
            written.append(rows.write(job.name, {}, options, job))
    return written
