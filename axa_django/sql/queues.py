"""The worker's statements for queues with a fleet-wide limit (``axa_queue_limit``), beside sql.py.

``{names}``, ``{backends}`` and ``{queues}`` are filled by ``sql.compose``. The plain
CLAIM passes over limited queues (``sql.HELD_ANY``); their rows are claimed here, two
statements in one transaction sent as one pipeline, as the limited claim does:
- QUEUE_LOCK try-locks each limited queue this worker serves (a transaction-scoped
  advisory lock; a queue another worker is claiming is passed over, never waited for)
  and leaves the locked ones, with their limits, in the transaction's setting axa.queues.
- QUEUE_CLAIM, a new statement with a new snapshot that sees every claim committed under
  a queue's lock before, counts the queue's running rows and claims at most the rest of
  its limit. Counting in the statement that takes the lock would be racy: its snapshot
  predates the lock.
Running rows are counted from the table, so a slot comes back whenever its row stops
running: finished, failed, or rescued with a dead worker's lease. The count walks the
running rows (axa_queue_running), as many as the fleet runs at once.
"""

from __future__ import annotations

from .claims import CLAIM_RETURNING, CLAIMED

QUEUE_NAMESPACE = 0x0A7A0004

# OFFSET 0 keeps the filters below the lock: a queue is locked only if this worker
# serves it and it is not paused.
QUEUE_LOCK = f"""
SELECT set_config('axa.queues', COALESCE((
    SELECT jsonb_agg(jsonb_build_array(l.queue, l.max_running)) FROM (
        SELECT queue, max_running FROM axa_queue_limit
        WHERE true {{queue_filter}} AND NOT EXISTS (
            SELECT FROM axa_paused_queue p WHERE p.queue = axa_queue_limit.queue)
        ORDER BY queue OFFSET 0
    ) AS l
    WHERE pg_try_advisory_xact_lock({QUEUE_NAMESPACE}, hashtext(l.queue))
), '[]')::text, true)
"""

_QUEUE_WALKS = """
            SELECT c.ctid, c.priority, c.run_at FROM unnest({names}::text[]) AS n(name)
            CROSS JOIN LATERAL (
                SELECT ctid, priority, run_at FROM ONLY axa_queue
                WHERE status BETWEEN 'queued' AND 'queued' AND queue = f.queue AND name = n.name AND backend IS NULL
                  AND run_at <= now()
                ORDER BY priority DESC, run_at
                LIMIT f.free
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION ALL
            SELECT t.ctid, t.priority, t.run_at FROM unnest({backends}::text[]) AS b(backend)
            CROSS JOIN LATERAL (
                SELECT ctid, priority, run_at FROM ONLY axa_queue
                WHERE status BETWEEN 'queued' AND 'queued' AND queue = f.queue AND backend = b.backend
                  AND run_at <= now()
                ORDER BY priority DESC, run_at
                LIMIT f.free
                FOR UPDATE SKIP LOCKED
            ) AS t"""

# Rows of a limited queue are claimed for free threads only (%(ahead)s is false): a row
# waiting in a worker would hold one of the fleet's few slots.
QUEUE_CLAIM = f"""
UPDATE ONLY axa_queue q{CLAIMED}
WHERE q.ctid = ANY(ARRAY(
    SELECT c.ctid FROM jsonb_array_elements(current_setting('axa.queues')::jsonb) AS l(v)
    CROSS JOIN LATERAL (
        SELECT l.v ->> 0 AS queue, GREATEST((l.v ->> 1)::int - (
            SELECT count(*) FROM ONLY axa_queue r WHERE r.status = 'running' AND r.queue = l.v ->> 0)::int, 0) AS free
    ) AS f
    CROSS JOIN LATERAL (
        SELECT w.ctid, w.priority, w.run_at FROM ({_QUEUE_WALKS}
        ) AS w
        ORDER BY w.priority DESC, w.run_at
        LIMIT f.free
    ) AS c
    LIMIT %(limit)s
)){CLAIM_RETURNING}"""

# The limited queues, for a worker to know whether to run the two above at all.
LIMITED_QUEUES = "SELECT queue FROM axa_queue_limit"

# Set, change or remove a queue's limit; idle workers wake at once (delivered at commit).
# A lifted limit hands the queue's rows back to the plain claim, which may have walked
# past them (worker/lanes.py): it walks from the start.
SET_LIMIT = """
WITH old AS (SELECT max_running FROM axa_queue_limit WHERE queue = %(queue)s),
new AS (
    INSERT INTO axa_queue_limit (queue, max_running, set_by) VALUES (%(queue)s, %(max_running)s, %(by)s)
    ON CONFLICT (queue) DO UPDATE SET max_running = EXCLUDED.max_running, set_by = EXCLUDED.set_by, set_at = now()
    RETURNING queue
)
SELECT (SELECT max_running FROM old), pg_notify('axa_queue', '') FROM new
"""
REMOVE_LIMIT = """
WITH gone AS (DELETE FROM axa_queue_limit WHERE queue = %(queue)s RETURNING max_running)
SELECT max_running, pg_notify('axa_queue', 'rescan') FROM gone
"""
