"""The worker's statements for jobs with concurrency and rate limits (beside sql.py, which holds the rest).

``{limited}`` is filled with the worker's limited job names, ``{queue_filter}`` and
``{paused}`` as in sql.py, by ``sql.compose``; ``{caps}``, the names' limits (or seconds
between starts), numbers only, by worker/limited.py before that.
"""

from __future__ import annotations

from .claims import CLAIM_RETURNING, CLAIM_RUN_AT, CLAIM_TIME, CLAIMED, NO_FLUSH, RUN_AT

# Jobs with a concurrency limit are claimed apart, so that jobs without one keep the
# CLAIM of sql.py unchanged. Four statements in one pipeline (one round trip;
# worker/limited.py), in two transactions:
# - FOLD brings axa_flow_key's per-pair counts of queued and running rows up to date:
#   the triggers of the initial migration write each change of a keyed row as a delta,
#   insert-only, and every claim folds those not folded yet into the pairs, locked in
#   (name, key) order. Its own transaction, so that the counters are locked for one
#   statement only.
# - LIMITED_PICK walks, per name, the pairs those counts say have queued rows and a
#   free slot (axa_flow_key_free: pairs at their limit are not in the walk at all, so a
#   claim never steps over them, however many sort first): first those with none
#   running, round robin from where the last claim stopped, then those partly busy,
#   fewest running first. It try-locks each (a transaction-scoped advisory lock; a pair
#   another worker is claiming is passed over, never waited for) and locks its best
#   queued rows, FOR UPDATE SKIP LOCKED, up to the slots its snapshot shows free. A row
#   lock sees the row's newest version, so a row another worker claimed a moment ago is
#   passed over too. At most %(reach)s pairs per name are walked (pairs whose rows all
#   wait for their run_at, are paused or held by others): the next claim goes on from
#   the last one walked. The rows go to the transaction's setting axa.picked.
# - CLAIM_LIMITED, a new statement with a new snapshot that sees every claim committed
#   under the pair's lock before, counts each pair's running rows and claims at most
#   the rest of its limit of the rows held. Counting in the statement that takes the
#   lock would be racy: its snapshot predates the lock. Rows held and not claimed are
#   let go at COMMIT, still queued.
# The counts only choose which pairs to walk; the slots are counted from axa_queue
# itself, so a limit is exact whatever the counts say, and a slot comes back whenever
# its row stops running: finished, failed, or rescued with a dead worker's lease.
LOCK_NAMESPACE = 0x0A7A0001
RATE_NAMESPACE = 0x0A7A0002
FOLD_NAMESPACE = 0x0A7A0003
# One fold at a time: a claim with deltas to fold waits for the fold under way (a
# millisecond: FOLD_LOCK), then FOLD, a new statement with a new snapshot, folds every
# delta committed before it, so the claim walks on counts that hold every change
# committed before it began. A snapshot taken before the lock would miss the deltas
# committed while it waited: the claim would walk a finished job's slot as still
# taken, come back empty, and wait for a stir (a fleet of six burst workers on 12 keys
# took 60 s instead of 6). Deltas of transactions older than the last fold's snapshot
# (its xmin: all ended by then) were folded by it, so a fold reads from there on
# (%(since)s, '0' for all): the dead rows left by earlier folds are not stepped over
# again. FOLD returns the xmin to read from next. Its commit does not wait for the WAL
# flush, as the claims' do not (the fold lock would be held over an fsync): a crash
# loses the fold whole, deltas and counts together.
FOLD_LOCK = f"""
SELECT pg_advisory_xact_lock({FOLD_NAMESPACE}, 0)
FROM (SELECT FROM axa_flow_delta WHERE xid >= %(since)s::text::xid8 LIMIT 1) AS pending
"""
FOLD = f"""
WITH taken AS (
    DELETE FROM axa_flow_delta WHERE id = ANY(ARRAY(
        SELECT id FROM axa_flow_delta WHERE xid >= %(since)s::text::xid8 FOR UPDATE SKIP LOCKED))
    RETURNING name, key, queued, running
), folded AS (
    INSERT INTO axa_flow_key AS k (name, key, queued, running)
    SELECT name, key, sum(queued), sum(running) FROM taken GROUP BY name, key ORDER BY name, key
    ON CONFLICT (name, key) DO UPDATE SET queued = k.queued + EXCLUDED.queued, running = k.running + EXCLUDED.running
)
SELECT pg_snapshot_xmin(pg_current_snapshot())::text, {NO_FLUSH}
"""
# Pairs down to nothing are left to housekeeping (once a minute; they are not in the
# walk's index): dropped in the hot path, each job of a key of its own paid for a
# delete under the fold lock. A pair a fold holds is passed over; one given rows again
# meanwhile is not dropped (FOR UPDATE reads the newest version). Never in a
# transaction that reads axa_queue: a TRUNCATE of it (axa_flow_truncate) would wait
# for the rows it holds while it waits for axa_queue.
DROP_IDLE = """
DELETE FROM axa_flow_key WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM axa_flow_key WHERE queued = 0 AND running = 0 LIMIT 10000 FOR UPDATE SKIP LOCKED
))
"""
_FREE_PAIRS = """
    SELECT n.name, n.cap, w.key, w.part, row_number() OVER () AS step
    FROM unnest({limited}::text[], {caps}) AS n(name, cap) CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT key, 1 AS part FROM axa_flow_key
             WHERE name = n.name AND queued > 0 AND running = 0 AND key >= %(start)s ORDER BY key LIMIT %(reach)s)
            UNION ALL
            (SELECT key, 2 AS part FROM axa_flow_key
             WHERE name = n.name AND queued > 0 AND running = 0 AND key < %(start)s ORDER BY key LIMIT %(reach)s)
            UNION ALL
            (SELECT key, 3 AS part FROM axa_flow_key
             WHERE name = n.name AND queued > 0 AND running > 0 AND running < n.cap ORDER BY running, key
             LIMIT %(reach)s)
        ) AS free LIMIT %(reach)s
    ) AS w"""
_PAIR_WALK = """
    SELECT n.name, n.cap, w.key FROM unnest({limited}::text[], {caps}) AS n(name, cap) CROSS JOIN LATERAL (
        WITH RECURSIVE walk AS (
            (SELECT 1 AS i, {column} AS key FROM ONLY axa_queue
             WHERE status = 'queued' AND {column} IS NOT NULL AND name = n.name AND {column} {start}
             ORDER BY {column} LIMIT 1)
            UNION ALL
            SELECT p.i + 1, x.key FROM walk p CROSS JOIN LATERAL (
                SELECT {column} AS key FROM ONLY axa_queue
                WHERE status = 'queued' AND {column} IS NOT NULL AND name = n.name AND {column} > p.key
                  {end}
                ORDER BY {column} LIMIT 1
            ) AS x WHERE p.i < %(reach)s
        )
        SELECT key FROM walk
    ) AS w"""


def _walks(column: str) -> str:
    # The walk from the last key of the previous claim comes first, then the one from
    # the first key up to it (wrapping round). Rows are pulled from them lazily, only
    # until the statement's LIMIT is met.
    walk = _PAIR_WALK.replace("{column}", column)
    return f"""(
        {walk.replace("{start}", ">= %(start)s").replace("{end}", "")}
        UNION ALL
        {walk.replace("{start}", "< %(start)s").replace("{end}", f"AND {column} < %(start)s")}
    )"""


def _lock(namespace: int, name: str, key: str) -> str:
    return f"pg_try_advisory_xact_lock({namespace}, hashtext({name} || E'\\x1f' || {key}))"


_BUSY = """(SELECT count(*) FROM ONLY axa_queue r
        WHERE r.status = 'running' AND r.concurrency_key = {key} AND r.name = {name})"""
# The walk is referenced twice, so it is computed once, whole (at most %(reach)s pairs
# a name). The key to start the next claim from: the last one rows were picked from,
# else the last one walked with none running (past pairs that gave nothing).
LIMITED_PICK = f"""
WITH walked AS ({_FREE_PAIRS}
), picked AS MATERIALIZED (
    SELECT c.ctid, walked.name, walked.key, walked.cap, c.priority, c.run_at, walked.step AS n
    FROM walked
    CROSS JOIN LATERAL (
        SELECT count(*) AS busy FROM ONLY axa_queue r
        WHERE r.status = 'running' AND r.concurrency_key = walked.key AND r.name = walked.name
    ) AS b
    CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
        WHERE status = 'queued' AND concurrency_key = walked.key AND name = walked.name AND run_at <= now()
          {{queue_filter}} {{paused}}
        ORDER BY priority DESC, run_at
        LIMIT CASE WHEN b.busy < walked.cap THEN
            CASE WHEN {_lock(LOCK_NAMESPACE, "walked.name", "walked.key")} THEN walked.cap - b.busy ELSE 0 END
        ELSE 0 END
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(limit)s
)
SELECT set_config('axa.picked', COALESCE((SELECT jsonb_agg(to_jsonb(picked)) FROM picked), '[]')::text, true),
    COALESCE((SELECT key FROM picked ORDER BY n DESC LIMIT 1),
        (SELECT key FROM walked WHERE part < 3 ORDER BY step DESC LIMIT 1))
"""
# Rows are claimed ahead of free threads as by CLAIM (%(ahead)s): a row waiting in the
# worker holds its slot, for no longer than the worker's claim-ahead horizon. The rows'
# places (ctids) are gathered in ARRAY(...), run once, and the rows found there, as in
# CLAIM: LIMITED_PICK holds them locked, so they stay where it found them. Joined
# instead, a generic plan made while the statistics said nothing was queued walked
# every queued row against the picked ones.
CLAIM_LIMITED = f"""
UPDATE ONLY axa_queue q{CLAIMED}
WHERE q.ctid = ANY(ARRAY(
    SELECT ctid FROM (
        SELECT p.ctid, p.cap - {_BUSY.format(key="p.key", name="p.name")} AS free,
            row_number() OVER (PARTITION BY p.name, p.key ORDER BY p.priority DESC, p.run_at) AS rank
        FROM jsonb_to_recordset(current_setting('axa.picked')::jsonb)
            AS p(ctid tid, name text, key text, cap int, priority int, run_at timestamptz)
    ) AS ranked
    WHERE rank <= free
)){CLAIM_RETURNING}"""

# Jobs with a rate limit (at most N starts per period and key, across the fleet): the
# same pair walk and try-lock over rate_key, then one statement that claims at most one
# row per pair whose next start is due (its theoretical arrival time, tat, is past) and
# moves the pair's tat one interval (period / N, the pair's cap here) on. Starts are
# spaced evenly, as Celery's rate_limit spaces them, so no window of one period ever
# holds more than N; there are no bursts. RATE_WAIT then says when the next token of a
# locked pair falls due, for the dispatcher to wake at. All three go in one pipeline.
# Rate-limited rows are claimed for free threads only: a token spent on a row that
# waits in the worker would bring two starts closer than the interval.
# The pairs it locked go to axa.pairs, with the seconds between their starts.
RATED_PAIRS = f"""
WITH found AS MATERIALIZED (
    SELECT name, cap, key, row_number() OVER () AS n FROM {_walks("rate_key")} AS walked
    WHERE {_lock(RATE_NAMESPACE, "name", "key")}
    LIMIT %(limit)s
)
SELECT set_config('axa.pairs', COALESCE(
        (SELECT jsonb_agg(jsonb_build_object('name', name, 'key', key, 'cap', cap)) FROM found), '[]')::text, true),
    (SELECT key FROM found ORDER BY n DESC LIMIT 1)
"""
CLAIM_RATED = f"""
WITH state AS (
    SELECT p.name, p.key, p.cap AS step, COALESCE(b.tat, '-infinity') AS tat
    FROM jsonb_to_recordset(current_setting('axa.pairs')::jsonb) AS p(name text, key text, cap float8)
    LEFT JOIN axa_rate_bucket b ON b.name = p.name AND b.key = p.key
), picked AS MATERIALIZED (
    SELECT c.ctid, s.name, s.key, s.step FROM state s CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
        WHERE status = 'queued' AND rate_key = s.key AND name = s.name AND run_at <= now()
          {{queue_filter}} {{paused}}
        ORDER BY priority DESC, run_at
        LIMIT CASE WHEN s.tat <= now() THEN 1 ELSE 0 END
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(limit)s
), claimed AS (
    UPDATE ONLY axa_queue q
    SET status = 'running', started_at = now(), updated_at = now(),
        attempts = LEAST(q.attempts, 2147483646) + 1, worker_id = %(worker)s, cancel_requested = false,
        run_at = {RUN_AT}
    FROM picked
    WHERE q.ctid = picked.ctid
    RETURNING q.id, q.name, q.args::text, q.attempts, q.max_attempts, q.backend, q.priority, q.run_at,
        q.timeout, picked.key AS pair_key, picked.step
), spent AS (
    INSERT INTO axa_rate_bucket (name, key, tat)
    SELECT name, pair_key, now() + make_interval(secs => step) FROM claimed
    ON CONFLICT (name, key) DO UPDATE SET tat = EXCLUDED.tat
    RETURNING 1
)
SELECT id, name, args, attempts, max_attempts, backend, false, priority, {CLAIM_RUN_AT},
    {NO_FLUSH}, timeout, {CLAIM_TIME}, (SELECT count(*) FROM spent)
FROM claimed q
"""
RATE_WAIT = """
SELECT extract(epoch FROM min(b.tat) - now())::float8
FROM jsonb_to_recordset(current_setting('axa.pairs')::jsonb) AS p(name text, key text)
JOIN axa_rate_bucket b ON b.name = p.name AND b.key = p.key
WHERE b.tat > now()
"""

# Rows of limited jobs written without a key get the job's shared key ('');
# housekeeping, at most 1,000 rows a time.
ADOPT_UNKEYED = """
UPDATE ONLY axa_queue SET {column} = '' WHERE id = ANY(ARRAY(
    SELECT id FROM ONLY axa_queue WHERE status = 'queued' AND name = ANY(%(names)s::text[]) AND {column} IS NULL
    LIMIT 1000 FOR UPDATE SKIP LOCKED
))
RETURNING id
"""
