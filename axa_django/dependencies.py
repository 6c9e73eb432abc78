"""Dependencies between jobs (workflows): settling children as parents end, reviving them on retry.

A child with unfinished parents is ``waiting``; its ``pending_parents`` counts them.
Each edge of ``axa_dependency`` is counted once (``done``), in the transaction that
ends its parent, and the counter is decremented on the child's row under its row
lock: two last parents ending at once on two workers serialize on the child, so
exactly one of them sees the counter reach 0 and queues it. Statements only; they
run on whatever cursor the caller holds, inside the caller's transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from .sql import retry

FINISHED = ("completed", "failed", "cancelled")
POLICIES = ("cancel", "run")
# Error text of a child cancelled because a parent did not complete; revive looks for it.
PARENT_FAILED = "ParentFailed"
# How SETTLE_GONE names a parent deleted before it ended: not completed, so its children
# are settled as a cancel settles them (their on_parent_failure), their error saying why.
DELETED = "deleted"

# Settle the children of jobs that just ended: mark their edges counted, decrement each
# child's counter, queue it at 0, cancel it (and, through the graph, the descendants
# that would wait on it) when a parent did not complete and it does not ask to run
# anyway. One statement however deep the cancellation goes. Queued children wake the
# workers with their oldest run_at ("ready:<epoch>"): behind the claims' floors
# (worker/lanes.py), they would otherwise wait for a full walk. run_at stays as enqueued
# (a delay still applies; a child waits behind nothing that was queued after it). The children are locked
# in id order, so two finishers settling overlapping children cannot deadlock.
SETTLE = f"""
WITH RECURSIVE ended AS (
    SELECT id, status FROM axa_queue
    WHERE id = ANY(%(ids)s::uuid[]) AND has_children AND status IN ('completed', 'failed', 'cancelled')
), doomed(id, cause, cause_status) AS (
    SELECT q.id, e.id, e.status FROM ended e
    JOIN axa_dependency d ON d.parent_id = e.id AND NOT d.done
    JOIN axa_queue q ON q.id = d.child_id
    WHERE e.status <> 'completed' AND q.status = 'waiting' AND q.on_parent_failure IS DISTINCT FROM 'run'
    UNION
    SELECT q.id, x.id, 'cancelled' FROM doomed x
    JOIN axa_dependency d ON d.parent_id = x.id AND NOT d.done
    JOIN axa_queue q ON q.id = d.child_id
    WHERE q.status = 'waiting' AND q.on_parent_failure IS DISTINCT FROM 'run'
), first_cause AS (
    SELECT DISTINCT ON (id) id, cause, cause_status FROM doomed ORDER BY id, cause
), sources AS (
    SELECT id, status FROM ended
    UNION
    SELECT id, 'cancelled' FROM first_cause
), edges AS (
    UPDATE axa_dependency d SET done = true
    FROM sources s
    WHERE d.parent_id = s.id AND NOT d.done
    RETURNING d.child_id, d.parent_id, s.status
), per_child AS (
    SELECT child_id, count(*) AS n,
        (array_agg(parent_id ORDER BY parent_id) FILTER (WHERE status <> 'completed'))[1] AS bad,
        (array_agg(status ORDER BY parent_id) FILTER (WHERE status <> 'completed'))[1] AS bad_status
    FROM edges GROUP BY child_id
), locked AS (
    SELECT q.id FROM axa_queue q
    WHERE q.id IN (SELECT child_id FROM per_child) AND q.status = 'waiting'
    ORDER BY q.id
    FOR UPDATE
), changed AS (
    UPDATE axa_queue q
    SET pending_parents = GREATEST(q.pending_parents - c.n, 0),
        status = CASE
            WHEN f.id IS NOT NULL OR (c.bad IS NOT NULL AND q.on_parent_failure IS DISTINCT FROM 'run')
                THEN 'cancelled'
            WHEN q.pending_parents - c.n <= 0 THEN 'queued'
            ELSE 'waiting' END,
        error = CASE
            WHEN f.id IS NOT NULL OR (c.bad IS NOT NULL AND q.on_parent_failure IS DISTINCT FROM 'run')
                THEN format('{PARENT_FAILED}: parent job %%s %%s, so this job was cancelled',
                            COALESCE(f.cause, c.bad), CASE COALESCE(f.cause_status, c.bad_status)
                                WHEN '{DELETED}' THEN 'was deleted before it ended'
                                ELSE 'ended ' || COALESCE(f.cause_status, c.bad_status) END)
            ELSE q.error END,
        finished_at = CASE
            WHEN f.id IS NOT NULL OR (c.bad IS NOT NULL AND q.on_parent_failure IS DISTINCT FROM 'run')
                THEN now() END,
        updated_at = now()
    FROM per_child c
    JOIN locked l ON l.id = c.child_id
    LEFT JOIN first_cause f ON f.id = c.child_id
    WHERE q.id = c.child_id AND q.status = 'waiting'
    RETURNING q.id, q.status, q.run_at
)
SELECT id, status FROM changed
UNION ALL
SELECT NULL, 'woken' FROM (
    SELECT pg_notify('axa_queue', 'ready:' || extract(epoch FROM min(run_at))::text)
    FROM changed WHERE status = 'queued' HAVING count(*) > 0
) AS n
"""
_ENDED = """ended AS (
    SELECT id, status FROM axa_queue
    WHERE id = ANY(%(ids)s::uuid[]) AND has_children AND status IN ('completed', 'failed', 'cancelled')
)"""
assert _ENDED in SETTLE

# SETTLE for every ended job whose edges were not counted: a parent ended by the seed's
# FINISH (a Rust worker), failed by RESCUE (max_losses reached) or by FAIL_NEVER_DUE. A
# loose scan of the index of uncounted edges finds each such parent in one descent.
SWEEP = SETTLE.replace(
    _ENDED,
    """waiting_on(parent_id) AS (
    (SELECT parent_id FROM axa_dependency WHERE NOT done ORDER BY parent_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.parent_id FROM axa_dependency d
            WHERE NOT d.done AND d.parent_id > w.parent_id ORDER BY d.parent_id LIMIT 1)
    FROM waiting_on w WHERE w.parent_id IS NOT NULL
), ended AS (
    SELECT q.id, q.status FROM waiting_on w JOIN axa_queue q ON q.id = w.parent_id
    WHERE q.status IN ('completed', 'failed', 'cancelled')
    LIMIT 1000
)""",
)

# SETTLE for parents deleted in this transaction (models/moves.py: every delete through the
# ORM, so the admin's and the bulk delete's too), each with the status its row had when
# deleted: one deleted before it ended settles its children as if it had been cancelled;
# one that had ended settles them as it ended, which changes nothing once they were counted
# (by its finisher, or the sweep after the seed's FINISH), and else does what the sweep
# would have done: the sweep reads only parents that still exist. An id still found in a
# table is left alone (a row the delete did not take).
SETTLE_GONE = SETTLE.replace(
    _ENDED,
    f"""ended AS (
    SELECT g.id, CASE WHEN g.status IN ('completed', 'failed', 'cancelled') THEN g.status ELSE '{DELETED}' END AS status
    FROM unnest(%(ids)s::uuid[], %(statuses)s::text[]) AS g(id, status)
    WHERE NOT EXISTS (SELECT 1 FROM axa_queue q WHERE q.id = g.id)
)""",
)

# RETRY (sql/retry.py), also bringing back the descendants a retried job's failure cancelled:
# they wait again, counting every parent that has not completed (the retried one among
# them), in the same statement, so a retry is still one statement.
_REVIVE = f"""
), down(id) AS (
    SELECT q.id FROM retried r
    JOIN axa_dependency d ON d.parent_id = r.id
    JOIN axa_queue q ON q.id = d.child_id
    WHERE q.status = 'cancelled' AND q.error LIKE '{PARENT_FAILED}:%%'
    UNION
    SELECT q.id FROM down
    JOIN axa_dependency d ON d.parent_id = down.id
    JOIN axa_queue q ON q.id = d.child_id
    WHERE q.status = 'cancelled' AND q.error LIKE '{PARENT_FAILED}:%%'
), reset AS (
    UPDATE axa_dependency d SET done = false
    FROM axa_queue p
    WHERE d.child_id IN (SELECT id FROM down) AND p.id = d.parent_id AND p.status <> 'completed' AND d.done
), revived AS (
    UPDATE axa_queue q
    SET status = 'waiting', error = NULL, finished_at = NULL, updated_at = now(),
        pending_parents = (SELECT count(*) FROM axa_dependency d JOIN axa_queue p ON p.id = d.parent_id
                           WHERE d.child_id = q.id AND p.status <> 'completed')
    WHERE q.id IN (SELECT id FROM down) AND q.status = 'cancelled'
)
SELECT id, true, NULL::uuid FROM retried
"""
_TAIL = "\n)\nSELECT id, true, NULL::uuid FROM retried\n"
assert retry.RETRY.startswith("\nWITH candidate AS") and _TAIL in retry.RETRY, "sql/retry.py's RETRY changed shape"
RETRY = retry.RETRY.replace("\nWITH candidate AS", "\nWITH RECURSIVE candidate AS", 1).replace(_TAIL, _REVIVE, 1)


def parent_ids(after: Any) -> tuple[uuid.UUID, ...]:
    """The ids ``after=`` names (jobs, ids, their str forms, or a perform_later_many result), once each, in order.

    TypeError/ValueError on anything else, before any SQL.
    """
    if isinstance(after, str | uuid.UUID) or hasattr(after, "_meta"):
        after = [after]  # one job given alone
    try:
        items: Iterable[Any] = iter(after)
    except TypeError:
        raise TypeError(f"after= takes a list of jobs or job ids, not {type(after).__name__}") from None
    found: dict[uuid.UUID, None] = {}
    for index, item in enumerate(items):
        value = getattr(item, "pk", item) if hasattr(item, "_meta") else item
        if isinstance(value, str):
            try:
                value = uuid.UUID(value)
            except ValueError:
                raise ValueError(f"after=[{index}]: {value!r} is not a job id (a UUID)") from None
        if not isinstance(value, uuid.UUID):
            raise TypeError(
                f"after=[{index}]: expected a job (from perform_later) or a job id, not {type(item).__name__}"
            )
        found[value] = None
    return tuple(found)


def check_policy(policy: Any) -> str:
    """Return ``on_parent_failure`` if it is one the worker knows."""
    if policy not in POLICIES:
        raise ValueError(
            f"on_parent_failure must be 'cancel' (the default: the job and its descendants are cancelled) "
            f"or 'run' (run it anyway), not {policy!r}"
        )
    return str(policy)


def settle(cursor: Any, ids: Iterable[uuid.UUID]) -> list[tuple[uuid.UUID, str]]:
    """Settle the children of jobs ``ids`` that have ended; return (child id, new status) for each changed."""
    ids = list(ids)
    if not ids:
        return []
    cursor.execute(SETTLE, {"ids": ids})
    return [(row[0], row[1]) for row in cursor.fetchall() if row[0] is not None]


def settle_gone(cursor: Any, rows: Iterable[tuple[uuid.UUID, str]]) -> list[tuple[uuid.UUID, str]]:
    """Settle the children of parents just deleted, given as (id, status its row had); return those changed."""
    rows = list(rows)
    if not rows:
        return []
    cursor.execute(SETTLE_GONE, {"ids": [job_id for job_id, _ in rows], "statuses": [status for _, status in rows]})
    return [(row[0], row[1]) for row in cursor.fetchall() if row[0] is not None]
