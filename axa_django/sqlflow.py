"""The worker's statements for jobs with concurrency and rate limits (beside sql.py, which holds the rest).

``{limited}`` is filled with the worker's limited job names, ``{queue_filter}`` and
``{paused}`` as in sql.py, by ``sql.compose``.
"""

from __future__ import annotations

# Jobs with a concurrency limit are claimed apart, so that jobs without one keep the
# CLAIM of sql.py unchanged. Two statements in one transaction (workerflow.py): LIMITED_PAIRS
# finds (name, key) pairs with queued rows and try-locks each (a transaction-scoped
# advisory lock; a pair another worker is claiming is skipped, never waited for), then
# CLAIM_LIMITED, a new statement with a new snapshot that sees every claim committed
# under the lock before, counts each locked pair's running rows and claims at most the
# rest of its limit. Counting in the statement that takes the lock would be racy: its
# snapshot predates the lock. Running rows are counted from the table itself, so a
# slot comes back whenever its row stops running: finished, failed, or rescued with a
# dead worker's lease. Pairs are walked per name over axa_queue_claim_limited (a skip
# scan), from where the last claim stopped and wrapping round, so a held-back key never
# blocks the keys behind it.
LOCK_NAMESPACE = 0x0A7A0001
RATE_NAMESPACE = 0x0A7A0002
_PAIR_WALK = """
    SELECT n.name, w.key FROM unnest({limited}::text[]) AS n(name) CROSS JOIN LATERAL (
        WITH RECURSIVE walk AS (
            (SELECT 1 AS i, {column} AS key FROM axa_queue
             WHERE status = 'queued' AND {column} IS NOT NULL AND name = n.name AND {column} {start}
             ORDER BY {column} LIMIT 1)
            UNION ALL
            SELECT p.i + 1, x.key FROM walk p CROSS JOIN LATERAL (
                SELECT {column} AS key FROM axa_queue
                WHERE status = 'queued' AND {column} IS NOT NULL AND name = n.name AND {column} > p.key
                ORDER BY {column} LIMIT 1
            ) AS x WHERE p.i < %(pairs)s
        )
        SELECT key FROM walk
    ) AS w"""


def _pairs(column: str, namespace: int) -> str:
    # The walk from the last key of the previous claim comes first, the wrapped one
    # after; a pair both find comes twice (its lock is taken again, harmlessly) and the
    # worker keeps it once.
    walk = _PAIR_WALK.replace("{column}", column)
    return f"""
SELECT name, key FROM (
    {walk.replace("{start}", ">= %(start)s")}
    UNION ALL
    {walk.replace("{start}", "IS NOT NULL")}
    LIMIT %(pairs)s
) AS pairs
WHERE pg_try_advisory_xact_lock({namespace}, hashtext(name || E'\\x1f' || key))
"""


LIMITED_PAIRS = _pairs("concurrency_key", LOCK_NAMESPACE)
CLAIM_LIMITED = """
UPDATE axa_queue q
SET status = 'running', started_at = now(), updated_at = now(),
    attempts = LEAST(q.attempts, 2147483646) + 1, worker_id = %(worker)s, cancel_requested = false,
    run_at = CASE WHEN q.run_at = '-infinity' THEN now() ELSE q.run_at END
WHERE q.id = ANY(ARRAY(
    SELECT c.id FROM unnest(%(names)s::text[], %(keys)s::text[], %(limits)s::int[]) AS p(name, key, cap)
    CROSS JOIN LATERAL (
        SELECT count(*) AS busy FROM axa_queue r
        WHERE r.status = 'running' AND r.concurrency_key = p.key AND r.name = p.name
    ) AS b
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status = 'queued' AND concurrency_key = p.key AND name = p.name AND run_at <= now()
          {queue_filter} {paused}
        ORDER BY priority DESC, run_at
        LIMIT GREATEST(p.cap - b.busy, 0)
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at
    LIMIT %(limit)s
)) AND q.status = 'queued'
RETURNING q.id, q.name, q.args::text, q.attempts, q.max_attempts, q.backend, false,
    q.priority, q.run_at, set_config('synchronous_commit', 'off', true), q.timeout, now()
"""

# Jobs with a rate limit (at most N starts per period and key, across the fleet): the
# same pair walk and try-lock over rate_key, then one statement that claims at most one
# row per pair whose next start is due (its theoretical arrival time, tat, is past) and
# moves the pair's tat one interval (period / N) on. Starts are spaced evenly, as
# Celery's rate_limit spaces them, so no window of one period ever holds more than N;
# there are no bursts. RATE_WAIT then says when the next token of a locked pair falls
# due, for the dispatcher to wake at.
RATED_PAIRS = _pairs("rate_key", RATE_NAMESPACE)
CLAIM_RATED = """
WITH state AS (
    SELECT p.name, p.key, p.step, COALESCE(b.tat, '-infinity') AS tat
    FROM unnest(%(names)s::text[], %(keys)s::text[], %(steps)s::float8[]) AS p(name, key, step)
    LEFT JOIN axa_rate_bucket b ON b.name = p.name AND b.key = p.key
), picked AS MATERIALIZED (
    SELECT c.id, s.name, s.key, s.step FROM state s CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status = 'queued' AND rate_key = s.key AND name = s.name AND run_at <= now()
          {queue_filter} {paused}
        ORDER BY priority DESC, run_at
        LIMIT CASE WHEN s.tat <= now() THEN 1 ELSE 0 END
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(limit)s
), claimed AS (
    UPDATE axa_queue q
    SET status = 'running', started_at = now(), updated_at = now(),
        attempts = LEAST(q.attempts, 2147483646) + 1, worker_id = %(worker)s, cancel_requested = false,
        run_at = CASE WHEN q.run_at = '-infinity' THEN now() ELSE q.run_at END
    FROM picked
    WHERE q.id = picked.id AND q.status = 'queued'
    RETURNING q.id, q.name, q.args::text, q.attempts, q.max_attempts, q.backend, q.priority, q.run_at,
        q.timeout, picked.key AS pair_key, picked.step
), spent AS (
    INSERT INTO axa_rate_bucket (name, key, tat)
    SELECT name, pair_key, now() + make_interval(secs => step) FROM claimed
    ON CONFLICT (name, key) DO UPDATE SET tat = EXCLUDED.tat
    RETURNING 1
)
SELECT id, name, args, attempts, max_attempts, backend, false, priority, run_at,
    set_config('synchronous_commit', 'off', true), timeout, now(), (SELECT count(*) FROM spent)
FROM claimed
"""
RATE_WAIT = """
SELECT extract(epoch FROM min(b.tat) - now())::float8
FROM unnest(%(names)s::text[], %(keys)s::text[]) AS p(name, key)
JOIN axa_rate_bucket b ON b.name = p.name AND b.key = p.key
WHERE b.tat > now()
"""

# Rows of limited jobs written without a key get the job's shared key ('');
# housekeeping, at most 1,000 rows a time.
ADOPT_UNKEYED = """
UPDATE axa_queue SET {column} = '' WHERE id = ANY(ARRAY(
    SELECT id FROM axa_queue WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND {column} IS NULL
    LIMIT 1000 FOR UPDATE SKIP LOCKED
))
RETURNING id
"""
