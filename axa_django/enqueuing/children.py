"""Writing rows with parents (after=) or in a workflow: parents locked, edges written, all or none."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import OperationalError, connections, transaction

from .. import conf, dependencies
from ..models import Job
from ..signals import job_enqueued
from .encoding import _COLUMNS, _FROM_JSON, BulkResult, Sender, _as_json, _bulk_job, _migrated, _params, _watched
from .options import Options

# Rows with parents (after=) or in a workflow: the parents are locked in id order and
# marked has_children (so that their FINISH settles this child: see dependencies.py),
# and their status read under that lock decides the child's: waiting while some have
# not finished, cancelled if one did not complete (unless it runs anyway), else queued.
# Every parent must exist, or nothing is inserted. One statement per set of parents.
# Queued parents were locked here, so claims passed over them and may have walked past
# them (worker/lanes.py): they are announced as ready again, delivered at commit.
_CHILDREN = f"""
WITH locked AS (
    SELECT id FROM axa_queue WHERE id = ANY(%s::uuid[]) ORDER BY id FOR UPDATE
), parents AS (
    UPDATE axa_queue q SET has_children = true FROM locked WHERE q.id = locked.id
    RETURNING q.id, q.status, q.run_at
), state AS (
    SELECT count(*) AS found,
        count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'cancelled')) AS pending,
        (array_agg(id ORDER BY id) FILTER (WHERE status IN ('failed', 'cancelled')))[1] AS bad,
        (array_agg(status ORDER BY id) FILTER (WHERE status IN ('failed', 'cancelled')))[1] AS bad_status
    FROM parents
), choice AS (
    SELECT s.*, CASE WHEN s.bad IS NOT NULL AND %s <> 'run' THEN 'cancelled'
                     WHEN s.pending > 0 THEN 'waiting' ELSE 'queued' END AS status
    FROM state s WHERE s.found = %s
), inserted AS (
    INSERT INTO axa_queue ({_COLUMNS}, status, pending_parents, on_parent_failure, workflow_id, error, finished_at)
    SELECT v.*, c.status, CASE WHEN c.status = 'waiting' THEN c.pending ELSE 0 END, %s, %s::uuid,
        CASE WHEN c.status = 'cancelled' THEN format(
            '{dependencies.PARENT_FAILED}: parent job %%s ended %%s, so this job was cancelled', c.bad, c.bad_status)
        END,
        CASE WHEN c.status = 'cancelled' THEN now() END
    FROM ({_FROM_JSON}) AS v CROSS JOIN choice c
    RETURNING id, status
), edges AS (
    INSERT INTO axa_dependency (parent_id, child_id, done)
    SELECT p.id, i.id, p.status IN ('completed', 'failed', 'cancelled') FROM parents p CROSS JOIN inserted i
)
SELECT id, status FROM inserted
UNION ALL
SELECT NULL, 'woken' FROM (
    SELECT pg_notify('axa_queue', 'ready:' || extract(epoch FROM min(run_at))::text)
    FROM parents WHERE status = 'queued' HAVING count(*) > 0
) AS n
"""


def _children(using: str, cursor: Any, params: list[Any]) -> list[tuple[Any, ...]]:
    """Run _CHILDREN; again if it lost a deadlock (a finisher locking the same parents in another order)."""
    for attempt in range(5):
        try:
            with transaction.atomic(using=using):
                cursor.execute(_CHILDREN, params)
                return [row for row in cursor.fetchall() if row[0] is not None]
        except OperationalError as error:
            if attempt == 4 or not isinstance(error.__cause__, psycopg.errors.DeadlockDetected):
                raise
    raise AssertionError("unreachable")


def _missing(cursor: Any, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    cursor.execute("SELECT id FROM axa_queue WHERE id = ANY(%s::uuid[])", [list(ids)])
    found = {row[0] for row in cursor.fetchall()}
    return [job_id for job_id in ids if job_id not in found]


def write_children(
    items: Sequence[tuple[str, dict[str, Any], Options, uuid.UUID | None]],
    sender: Sender | Sequence[Sender],
    full: bool = False,
) -> BulkResult:
    """Insert rows with parents, one statement per run of items with the same parents, all or none.

    ``sender``: job_enqueued's sender, or one per item. ``full``: load every column of
    the rows back (one row, for perform_later).
    """
    using = conf.queue_database()
    prepared = []
    for index, (name, args, options, job_id) in enumerate(items):
        try:
            prepared.append((_params(name, args, options, job_id), options, args))
        except (TypeError, ValueError) as error:
            raise type(error)(f"item {index}: {error}") from None
    result = BulkResult()
    statuses: dict[uuid.UUID, str] = {}
    with _migrated(using), transaction.atomic(using=using), connections[using].cursor() as cursor:
        start = 0
        while start < len(prepared):
            key = (prepared[start][1].after, prepared[start][1].on_parent_failure, prepared[start][1].workflow)
            end = start + 1
            while end < len(prepared) and (
                (prepared[end][1].after, prepared[end][1].on_parent_failure, prepared[end][1].workflow) == key
            ):
                end += 1
            after, policy, workflow = key
            document = "[" + ",".join(_as_json(row) for row, _, _ in prepared[start:end]) + "]"
            params = [list(after), policy, len(after), policy, workflow, document]
            rows = _children(using, cursor, params)
            # A parent that finished while the statement waited for its lock moved into
            # the history, out of that statement's sight: the next statement sees it there.
            retries = 3
            while len(rows) != end - start and retries and not _missing(cursor, after):
                rows = _children(using, cursor, params)
                retries -= 1
            if len(rows) != end - start:
                missing = _missing(cursor, after)
                raise ValueError(
                    f"after= names job(s) that do not exist: {', '.join(map(str, missing)) or '(deleted meanwhile)'}; "
                    "pass jobs returned by perform_later (a job must exist before another can wait for it); "
                    "nothing was enqueued"
                )
            statuses.update(rows)
            start = end
        if full:
            result.append(Job.objects.using(using).get(pk=prepared[0][0][0]))
    if not full:
        watched = _watched()
        for row, options, args in prepared:
            result.append(_bulk_job(using, row[0], row[1], args, options, watched, statuses[row[0]]))
    senders = list(sender) if isinstance(sender, Sequence) else [sender] * len(result)
    for job, job_sender in zip(result, senders, strict=True):
        job_enqueued.send(sender=job_sender, job=job)
    return result
