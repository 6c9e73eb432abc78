"""Deleting old finished jobs in small batches, each its own transaction."""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, connections, transaction

from . import conf
from .sql import refused

logger = logging.getLogger("axa_django")

FINISHED = ("completed", "failed", "cancelled")
BATCH_SIZE = 5000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

# A job is old when both its creation and its last change are before the cutoff; the
# created_at bound lets the (status, created_at) index find the rows. SKIP LOCKED: a
# row someone is changing right now waits for the next batch instead of blocking this one.
# Rows whose delete the database refused (a user's foreign key or trigger) are passed
# over (%(skip)s): each was logged once, and a batch never fails on them again.
_MATCH = (
    "status = ANY(%(statuses)s) AND created_at < %(cutoff)s AND updated_at < %(cutoff)s "
    "AND NOT (id = ANY(%(skip)s::uuid[]))"
)
# The refused rows this process passes over, at most this many (then the oldest go).
REFUSED_KEPT = 10_000
_refused: dict[Any, None] = {}
# ARRAY(subquery) is an InitPlan, run once per statement. With ``id IN (subquery)`` the
# planner may pick a nested-loop semi join that rescans the subquery per outer row, each
# rescan locking LIMIT more rows: one "batch" then deletes every matching row.
# Each deleted row comes back as its id if it has workflow edges (a parent, or a child:
# every child row names its on_parent_failure), else NULL, and its workflow's id.
DELETE_BATCH = f"""
DELETE FROM axa_queue WHERE id = ANY(ARRAY(
    SELECT id FROM axa_queue WHERE {_MATCH} LIMIT %(limit)s FOR UPDATE SKIP LOCKED
))
RETURNING CASE WHEN has_children OR on_parent_failure IS NOT NULL THEN id END, workflow_id
"""
# The edges of deleted jobs: all of a child's, and a parent's counted ones (an uncounted
# edge still holds a child back until housekeeping settles it); and the workflows and
# batches left with no job.
DELETE_LINKS = """
WITH edges AS (
    DELETE FROM axa_dependency
    WHERE child_id = ANY(%(ids)s::uuid[]) OR (parent_id = ANY(%(ids)s::uuid[]) AND done)
)
DELETE FROM axa_workflow w
WHERE w.id = ANY(%(groups)s::uuid[]) AND NOT EXISTS (SELECT 1 FROM axa_queue q WHERE q.workflow_id = w.id)
"""


def _delete(cursor: Any, params: dict[str, Any], statement: str) -> int:
    cursor.execute(statement, params)
    rows = cursor.fetchall()
    linked = [row[0] for row in rows if row[0] is not None]
    groups = list({row[1] for row in rows if row[1] is not None})
    if linked or groups:
        cursor.execute(DELETE_LINKS, {"ids": linked, "groups": groups})
    return len(rows)


def _delete_batch(cursor: Any, params: dict[str, Any], statement: str = DELETE_BATCH) -> int:
    """Delete one batch in a transaction (or savepoint) of its own; a batch refused for one
    row's sake is deleted row by row, the refused rows kept and passed over from then on."""
    params = {**params, "skip": list(_refused)}
    alias = cursor.db.alias
    try:
        with transaction.atomic(using=alias):
            return _delete(cursor, params, statement)
    except DatabaseError as error:
        if not refused.refusal(error):
            raise
        why = refused.reason(error)
    # The batch's rows, one statement each (ONLY, as the batch had it, for RETENTION's own rows).
    only = "ONLY " if "FROM ONLY axa_queue" in statement else ""
    cursor.execute(f"SELECT id FROM {only}axa_queue WHERE {_MATCH} LIMIT %(limit)s", params)
    ids = [row[0] for row in cursor.fetchall()]
    one = statement.replace("WHERE id = ANY(ARRAY(", "WHERE id = %(id)s AND id = ANY(ARRAY(", 1)

    def write(job_id: Any, again: str | None) -> None:
        if again is not None:
            # A delete has no "in place": the row stays, passed over.
            raise refused.Refused(DatabaseError("a delete has nothing else to try"))
        with transaction.atomic(using=alias):
            _delete(cursor, {**params, "id": job_id}, one)

    kept = refused.each(ids, write, refused.refusal, "prune of job")
    for job_id in kept:
        _refused[job_id] = None
    while len(_refused) > REFUSED_KEPT:
        del _refused[next(iter(_refused))]
    if kept:
        logger.error("pruning: %d job(s) could not be deleted (%s); they are passed over from now on", len(kept), why)
    return len(ids) - len(kept)


# The same for the rows finished in axa_queue itself: written finished by an INSERT (a
# child of a failed parent, a row written by hand). RETENTION drops the history's
# tables whole (history.py) and deletes only these.
DELETE_BATCH_QUEUE = DELETE_BATCH.replace("FROM axa_queue", "FROM ONLY axa_queue")
assert DELETE_BATCH_QUEUE.count("ONLY") == 2, "DELETE_BATCH changed shape"

COUNT = f"SELECT count(*) FROM axa_queue WHERE {_MATCH}"


def parse_duration(text: str) -> datetime.timedelta:
    """Parse ``30s``, ``15m``, ``12h``, ``7d`` or ``2w`` into a timedelta."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text or "")
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"expected a positive duration such as 30s, 15m, 12h, 7d or 2w, not {text!r}")
    return datetime.timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def format_duration(duration: datetime.timedelta) -> str:
    """Write a duration the way ``parse_duration`` reads it, in its largest whole unit up to days."""
    seconds = int(duration.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{duration.total_seconds():g}s"


def _statuses(statuses: Iterable[str] | None) -> list[str]:
    chosen = sorted(set(statuses or FINISHED))
    unknown = [s for s in chosen if s not in FINISHED]
    if unknown:
        raise ValueError(f"can only prune finished jobs ({', '.join(FINISHED)}), not {', '.join(unknown)}")
    return chosen


def _cutoff(cursor: Any, older_than: datetime.timedelta) -> datetime.datetime:
    # The database clock decides what is old, as everywhere else in axa_django.
    cursor.execute("SELECT now() - %s", [older_than])
    return cursor.fetchone()[0]


def count(older_than: datetime.timedelta, statuses: Iterable[str] | None = None, using: str | None = None) -> int:
    """How many jobs ``prune`` would delete now."""
    params = {"statuses": _statuses(statuses)}
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        params["cutoff"] = _cutoff(cursor, older_than)
        cursor.execute(COUNT, {**params, "skip": list(_refused)})
        return cursor.fetchone()[0]


def prune_batch(
    older_than: datetime.timedelta,
    statuses: Iterable[str] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    using: str | None = None,
    history: bool = True,
) -> int:
    """Delete at most ``batch_size`` old finished jobs in one statement; return how many.

    With ``history=False``, only those still in ``axa_queue`` itself, not in its history tables.
    """
    params = {"statuses": _statuses(statuses), "limit": batch_size}
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        params["cutoff"] = _cutoff(cursor, older_than)
        return _delete_batch(cursor, params, DELETE_BATCH if history else DELETE_BATCH_QUEUE)


def prune(
    older_than: datetime.timedelta,
    statuses: Iterable[str] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    using: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Delete old finished jobs batch by batch (autocommit: one transaction each); return the total.

    ``progress(deleted_in_batch, total_so_far)`` is called after each batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive whole number, not {batch_size!r}")
    params = {"statuses": _statuses(statuses), "limit": batch_size}
    connection = connections[using or conf.get("DATABASE")]
    if connection.in_atomic_block:
        # One giant transaction would hold every deleted row's lock until the end.
        raise RuntimeError("prune() runs one transaction per batch; call it outside transaction.atomic()")
    total = 0
    with connection.cursor() as cursor:
        # A fixed cutoff: rows finishing while we prune are not chased.
        params["cutoff"] = _cutoff(cursor, older_than)
        while True:
            deleted = _delete_batch(cursor, params)
            total += deleted
            if progress is not None:
                progress(deleted, total)
            if deleted < batch_size:
                return total
