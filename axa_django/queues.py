"""Queues as a whole: pause and resume them, limit them fleet-wide, and list them with their counts and limits.

A pause is a row of ``axa_paused_queue``: every worker's claim skips the queue while
it exists (jobs already running finish), whatever host the worker runs on. Resuming
deletes the row and notifies ``axa_queue``, so idle workers claim at once. A limit is a
row of ``axa_queue_limit``: at most that many of the queue's jobs run at once across
every worker (sqlqueues.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from . import conf, registry, sql
from .models import QueueLimit, QueuePause
from .selection import check_queue
from .sql import queues as sqlqueues

MAX_REASON = 1000

__all__ = ["QueueInfo", "limit", "limits", "overview", "pause", "paused", "resume", "unlimit"]

MAX_RUNNING = 2**31 - 1


@dataclass(frozen=True)
class QueueInfo:
    """One queue as ``manage.py queues`` shows it."""

    name: str
    ready: int = 0
    running: int = 0
    paused: bool = False
    reason: str = ""
    paused_at: datetime.datetime | None = None
    # Job names whose default queue this is, and what limits them (timeout, concurrency, rate).
    limits: list[str] = field(default_factory=list)
    # The queue's fleet-wide limit (at most this many of its jobs running at once), if any.
    max_running: int | None = None


def _reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}")
    if "\x00" in reason or any("\ud800" <= char <= "\udfff" for char in reason):
        raise ValueError("reason cannot contain NUL characters or lone surrogates (PostgreSQL cannot store them)")
    if len(reason) > MAX_REASON:
        raise ValueError(f"reason is {len(reason)} characters long; keep it to {MAX_REASON}")
    return reason


def pause(queue: str, reason: str = "", *, by: str = "", using: str | None = None) -> bool:
    """Pause ``queue`` for every worker; True if it was running, False if already paused (its reason is updated)."""
    queue, reason, by = check_queue(queue), _reason(reason), _reason(by)
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_paused_queue (queue, reason, paused_by) VALUES (%s, %s, %s) "
            "ON CONFLICT (queue) DO UPDATE SET reason = EXCLUDED.reason, paused_by = EXCLUDED.paused_by "
            "RETURNING xmax = 0",
            [queue, reason, by],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


def resume(queue: str, *, using: str | None = None) -> bool:
    """Resume ``queue`` and wake idle workers; True if it was paused."""
    queue = check_queue(queue)
    alias = using or conf.get("DATABASE")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sql.RESUME, {"queue": queue})
        row = cursor.fetchone()
    return bool(row and row[0])


def limit(queue: str, max_running: int, *, by: str = "", using: str | None = None) -> int | None:
    """Let at most ``max_running`` jobs of ``queue`` run at once across every worker; return the previous limit.

    Jobs already running go on; workers wake at once, so a raised limit is used at once.
    """
    queue, by = check_queue(queue), _reason(by)
    if type(max_running) is not int or not 0 < max_running <= MAX_RUNNING:
        raise ValueError(
            f"max_running must be a whole number from 1 to {MAX_RUNNING}, not {max_running!r}; "
            "to stop a queue use pause(), to lift its limit unlimit()"
        )
    alias = using or conf.get("DATABASE")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sqlqueues.SET_LIMIT, {"queue": queue, "max_running": max_running, "by": by})
        row = cursor.fetchone()
    return row[0] if row else None


def unlimit(queue: str, *, using: str | None = None) -> int | None:
    """Lift ``queue``'s fleet-wide limit and wake idle workers; return the limit it had (None: it had none)."""
    queue = check_queue(queue)
    alias = using or conf.get("DATABASE")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(sqlqueues.REMOVE_LIMIT, {"queue": queue})
        row = cursor.fetchone()
    return row[0] if row else None


def limits(*, using: str | None = None) -> dict[str, int]:
    """The queues with a fleet-wide limit: queue name -> at most this many running."""
    return dict(QueueLimit.objects.using(using or conf.get("DATABASE")).values_list("queue", "max_running"))


def paused(*, using: str | None = None) -> dict[str, QueuePause]:
    """The paused queues, by name."""
    return {p.queue: p for p in QueuePause.objects.using(using or conf.get("DATABASE"))}


def _limits() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, job in sorted(registry.registry.items()):
        found.setdefault(job.options.queue, [])
        described = describe_limits(job)
        if described:
            found[job.options.queue].append(f"{name}: {described}")
    return found


def describe_limits(job: Any) -> str:
    """A job's flow limits in words, e.g. ``timeout 30s, concurrency 1 per key``; empty if it has none."""
    said = []
    if job.options.timeout:
        said.append(f"timeout {job.options.timeout:g}s")
    if job.concurrency:
        said.append(f"concurrency {job.concurrency}{' per key' if job.concurrency_key else ''}")
    if job.rate:
        said.append(f"rate {job.rate.text}{' per key' if job.rate_key else ''}")
    return ", ".join(said)


def overview(*, using: str | None = None) -> list[QueueInfo]:
    """Every queue that has ready or running jobs, is paused, or is a registered job's default, by name."""
    alias = using or conf.get("DATABASE")
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT queue, count(*) FILTER (WHERE status = 'queued' AND run_at <= now()), "
            "count(*) FILTER (WHERE status = 'running') FROM axa_queue "
            "WHERE status IN ('queued', 'running') GROUP BY queue"
        )
        counts = {queue: (ready, running) for queue, ready, running in cursor.fetchall()}
    pauses = paused(using=alias)
    caps = limits(using=alias)
    described = _limits()
    queues = []
    for name in sorted(set(counts) | set(pauses) | set(described) | set(caps)):
        ready, running = counts.get(name, (0, 0))
        pause_row = pauses.get(name)
        queues.append(
            QueueInfo(
                name,
                ready,
                running,
                pause_row is not None,
                pause_row.reason if pause_row else "",
                pause_row.paused_at if pause_row else None,
                described.get(name, []),
                caps.get(name),
            )
        )
    return queues


def format_table(queues: list[QueueInfo]) -> str:
    """``overview()`` as aligned text columns."""
    lines = [["QUEUE", "READY", "RUNNING", "STATE", "LIMITS"]]
    for q in queues:
        reason = " ".join(q.reason.split())  # one line, whatever the reason holds
        state = "paused" + (f" ({reason})" if reason else "") if q.paused else "active"
        said = ([f"at most {q.max_running} running"] if q.max_running is not None else []) + q.limits
        lines.append([q.name, str(q.ready), str(q.running), state, "; ".join(said) or "-"])
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines)
