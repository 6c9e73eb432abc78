"""The statements the worker runs, kept together so their guards can be read side by side.

The claims are in ``claims`` (names re-exported here); the rest, from the finish to the
rescue, here. Statements that write end their RETURNING with ``set_config('synchronous_commit',
'off', true)``: that transaction alone skips the WAL flush, and no session setting
is left on a connection a pooler may hand to someone else.
"""

from __future__ import annotations

from .claims import (
    CLAIM as CLAIM,
)
from .claims import (
    CLAIM_FULL as CLAIM_FULL,
)
from .claims import (
    CLAIM_LANES as CLAIM_LANES,
)
from .claims import (
    CLAIM_RETURNING as CLAIM_RETURNING,
)
from .claims import (
    CLAIMED as CLAIMED,
)
from .claims import (
    FLEET_PROBE as FLEET_PROBE,
)
from .claims import (
    HELD_ANY as HELD_ANY,
)
from .claims import (
    HELD_ONE as HELD_ONE,
)
from .claims import (
    LOOK_BEHIND as LOOK_BEHIND,
)
from .claims import (
    NEXT_RUN as NEXT_RUN,
)
from .claims import NO_FLUSH
from .claims import (
    PAUSED_ANY as PAUSED_ANY,
)
from .claims import (
    PAUSED_ONE as PAUSED_ONE,
)
from .claims import (
    compose as compose,
)
from .claims import (
    segments as segments,
)

# An attempt lost to the database (its connection died under the job; execution.lost) is
# counted as RESCUE counts a dead worker's: its attempt given back, a loss counted, and
# past max_losses (the outcome's "lost": the default, unless the row has its own) the job
# fails, moved into the history by axa_history_keep.
_LOSSES = "(LEAST(q.losses, 2147483646) + 1)"
_SPENT = f"(v.lost IS NOT NULL AND {_LOSSES} >= COALESCE(q.max_losses, v.lost))"

# Record outcomes; a row is only written while still running under this worker. (A retry
# of a job whose cancel was asked meanwhile ends it cancelled: the axa_queue_requeue guard.) The
# batch comes as one JSON array (execution.finish), a single parameter to send: the
# result nested as {"v": ...} so that a JSON null stays a JSON null. A finished row
# moves into the history (history.py): deleted from axa_queue and inserted into
# axa_history, which writes fewer index entries than updating it in place, and leaves
# the claims' table only the rows still to run. A retry stays in place. A job with
# children is left out: execution.finish writes it apart and settles its children
# in one transaction (FINISH_PARENTS), so a childless job costs nothing more. The rows
# are found by their ids (an InitPlan array, the index's condition): joined to the
# outcomes, a generic plan made on statistics that saw few running rows walked the
# whole primary key for each batch (11,000 buffers a finish under a held snapshot).
HISTORY_COLUMNS = (
    "id, name, args, status, error, run_at, started_at, created_at, updated_at, queue, priority, attempts, "
    "max_attempts, worker_id, finished_at, errors, result, unique_key, cancel_requested, backend, timeout, "
    "concurrency_key, rate_key, has_children, on_parent_failure, pending_parents, workflow_id, trace_context, "
    "losses, max_losses"
)
_FINISH_WRITES = f"""
WITH v AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(outcomes)s::jsonb)
        AS v(id uuid, status text, error text, result jsonb, entry jsonb, delay float8, started float8,
            lost int)
), gone AS (
    DELETE FROM ONLY axa_queue q
    WHERE q.id = ANY(ARRAY(SELECT id FROM v WHERE status <> 'queued')) AND q.status || '' = 'running'
      AND q.worker_id IS NOT DISTINCT FROM %(worker)s
  AND NOT q.has_children
    RETURNING q.*
), moved AS (
    INSERT INTO axa_history ({HISTORY_COLUMNS})
    SELECT g.id, g.name, g.args, v.status, CASE WHEN v.status = 'completed' THEN g.error ELSE v.error END,
        g.run_at, COALESCE(g.started_at, to_timestamp(v.started)), g.created_at, now(), g.queue, g.priority,
        g.attempts, g.max_attempts, g.worker_id, now(),
        CASE WHEN v.entry IS NULL THEN g.errors ELSE g.errors || jsonb_build_array(v.entry) END,
        v.result -> 'v', g.unique_key, g.cancel_requested, g.backend, g.timeout, g.concurrency_key, g.rate_key,
        g.has_children, g.on_parent_failure, g.pending_parents, g.workflow_id, g.trace_context, g.losses,
        g.max_losses
    FROM gone g JOIN v ON v.id = g.id
    RETURNING id
), retried AS (
    UPDATE ONLY axa_queue q
    SET status = CASE WHEN {_SPENT} THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN {_SPENT} THEN format(
            'DatabaseLost: the database connection of this job was lost %%s times (max_losses %%s), so the job '
            'failed; if the job itself ends its connection (pg_terminate_backend, a timeout that ends sessions), '
            'fix that, then retry it. The last error:', {_LOSSES}, COALESCE(q.max_losses, v.lost))
            || chr(10) || v.error ELSE v.error END,
        result = v.result -> 'v',
        errors = CASE WHEN v.entry IS NULL THEN q.errors ELSE q.errors || jsonb_build_array(v.entry || CASE
            WHEN v.lost IS NULL THEN '{{}}'::jsonb
            ELSE jsonb_build_object('message', format('the database connection of this job was lost (loss %%s of %%s '
                'allowed); %%s', {_LOSSES}, COALESCE(q.max_losses, v.lost), CASE WHEN {_SPENT} THEN 'the job failed'
                ELSE 'the job was queued again, no attempt used' END)) END) END,
        run_at = CASE WHEN {_SPENT} THEN q.run_at ELSE now() + make_interval(secs => v.delay) END,
        started_at = CASE WHEN {_SPENT} THEN COALESCE(q.started_at, to_timestamp(v.started)) END,
        worker_id = CASE WHEN {_SPENT} THEN q.worker_id END,
        finished_at = CASE WHEN {_SPENT} THEN now() END,
        attempts = CASE WHEN v.lost IS NULL OR {_SPENT} THEN q.attempts ELSE GREATEST(q.attempts - 1, 0) END,
        losses = CASE WHEN v.lost IS NULL THEN q.losses ELSE {_LOSSES} END,
        updated_at = now()
    FROM v
    WHERE q.id = ANY(ARRAY(SELECT id FROM v WHERE status = 'queued')) AND q.id = v.id
      AND q.status || '' = 'running' AND q.worker_id IS NOT DISTINCT FROM %(worker)s
  AND NOT q.has_children
    RETURNING q.id, q.status
)
"""
# One row: the setting, the ids of the outcomes not written (jobs with children, rows
# rescued or changed meanwhile), most often none, and [id, status] of each retry that did
# not end queued, which the worker then reports so: an attempt lost to the database that
# failed the job (max_losses reached), a retry of a job whose cancel was asked (cancelled
# by the axa_queue_requeue guard). Returning the written ones sent every id back and the finisher loaded and
# hashed each (1 us a job of its CPU, measured apart).
FINISH = f"""{_FINISH_WRITES}SELECT {NO_FLUSH},
    ARRAY(SELECT id FROM v EXCEPT SELECT id FROM moved EXCEPT SELECT id FROM retried),
    ARRAY(SELECT ARRAY[id::text, status] FROM retried WHERE status <> 'queued')
"""
# FINISH for a batch of jobs that all completed and returned None, the common batch: the
# ids and start times as two arrays, which the server reads at 0.6 us a row less than the
# JSON outcomes (benchmarks/results/pg15-finish-completed-ab.txt).
_OUTCOMES = """SELECT * FROM jsonb_to_recordset(%(outcomes)s::jsonb)
        AS v(id uuid, status text, error text, result jsonb, entry jsonb, delay float8, started float8,
            lost int)"""
_COMPLETED = """SELECT id, 'completed'::text AS status, NULL::text AS error, '{"v": null}'::jsonb AS result,
        NULL::jsonb AS entry, 0::float8 AS delay, started, NULL::int AS lost
    FROM unnest(%(ids)s::uuid[], %(started)s::float8[]) AS v(id, started)"""
FINISH_COMPLETED = FINISH.replace(_OUTCOMES, _COMPLETED)
assert FINISH_COMPLETED != FINISH, "FINISH lost its outcomes"

# A worker row live within its lease. The lease is held within 0 and 1e9 s (31 years) in
# the arithmetic: a row whose lease_seconds was huge (written by hand, or under a
# transaction pooler, where nothing else bounds it) put now() minus it out of range, and
# failed every statement that read the fleet, the registration among them (review).
LIVE = "w.heartbeat_at > now() - LEAST(GREATEST(w.lease_seconds, 0), 1e9) * interval '1 second'"
# The workers live within their lease (the fleet drawing on this queue): each claims fewer
# rows ahead as the fleet grows (worker/dispatcher.py). Our own row counts once.
FLEET = f"""(SELECT count(*) + 1 FROM axa_worker w WHERE w.id <> %(worker)s AND {LIVE})"""
REGISTER = f"""
INSERT INTO axa_worker (
    id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at, lease_seconds)
VALUES (%(worker)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s::jsonb, %(names)s::jsonb,
        %(backends)s::jsonb, now(), now(), %(lease)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
RETURNING {FLEET}
"""

POLLER = f"""(SELECT w.id = %(worker)s FROM axa_worker w WHERE {LIVE} ORDER BY w.started_at, w.id LIMIT 1)"""
# Heartbeat, collect cancellations asked of this worker's running jobs, read back who asked
# it to stop from the admin (NULL: nobody; the Workers page), if ``elect`` whether it is the
# fleet's poller (worker/quiet.py: the eldest worker live within its lease; no session state),
# and how many workers are live.
# The jobs are found by their ids (the worker's in flight), never through axa_queue_running
# by worker id: under a held snapshot, that walk reads every row this worker ever ran, and
# a heartbeat slowed past its timeout would have the worker taken for dead.
HEARTBEAT = f"""
WITH beat AS (UPDATE axa_worker SET heartbeat_at = now() WHERE id = %(worker)s RETURNING id, stop_requested_by)
SELECT (SELECT count(*) FROM beat),
       ARRAY(SELECT id FROM ONLY axa_queue
             WHERE id = ANY(%(ids)s::uuid[]) AND worker_id IS NOT DISTINCT FROM %(worker)s
               AND status || '' = 'running' AND cancel_requested),
       {NO_FLUSH},
       (SELECT stop_requested_by FROM beat),
       CASE WHEN %(elect)s THEN {POLLER} END,
       {FLEET}
"""

# Requeue jobs of dead workers (no heartbeat within the lease), and rows claimed
# without a worker id (the seed's CLAIM) that have run past STALE_MINUTES. A loss is
# not the job's own error: the attempt is given back and the loss counted apart, so
# that a SIGKILLed, frozen or cut-off worker's job runs again at the defaults. A job
# that kills every worker running it (os._exit, the OOM killer) runs max_losses times,
# then fails, instead of looping forever. A row claimed ahead that no thread started
# comes back with neither counted. Seed rows (no worker id) are never failed here: the
# seed requeues them for ever, and their attempts were never counted.
RESCUE = """
WITH dead AS (
    DELETE FROM axa_worker WHERE heartbeat_at < now() - make_interval(secs => %(lease)s) RETURNING id
), lost AS (
    SELECT q.id,
        q.worker_id IS NOT NULL AND q.started_at IS NOT NULL
            AND q.losses + 1 >= COALESCE(q.max_losses, %(max_losses)s) AS spent,
        q.worker_id IS NOT NULL AND q.started_at IS NULL AS unstarted,
        LEAST(q.losses, 2147483646) + CASE WHEN q.worker_id IS NOT NULL AND q.started_at IS NULL THEN 0 ELSE 1 END
            AS losses,
        COALESCE(q.max_losses, %(max_losses)s) AS allowed
    FROM ONLY axa_queue q
    WHERE q.status = 'running' AND (
        (q.worker_id IS NOT NULL AND (
            q.worker_id IN (SELECT id FROM dead)
            OR NOT EXISTS (SELECT 1 FROM axa_worker w WHERE w.id = q.worker_id)))
        OR (q.worker_id IS NULL AND q.started_at < now() - make_interval(mins => %(stale)s)))
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE ONLY axa_queue q
SET status = CASE WHEN lost.spent THEN 'failed' ELSE 'queued' END,
    started_at = CASE WHEN lost.spent THEN q.started_at END,
    worker_id = CASE WHEN lost.spent THEN q.worker_id END,
    run_at = CASE WHEN lost.spent THEN q.run_at ELSE now() END,
    attempts = CASE WHEN lost.spent OR q.worker_id IS NULL THEN q.attempts ELSE GREATEST(q.attempts - 1, 0) END,
    losses = lost.losses,
    finished_at = CASE WHEN lost.spent THEN now() END,
    error = CASE WHEN lost.spent THEN format(
        'WorkerLost: the worker running this job stopped %%s times (max_losses %%s), so the job failed; '
        'if the job itself kills its worker (memory, os._exit), fix that, then retry it',
        lost.losses, lost.allowed) ELSE q.error END,
    updated_at = now(),
    errors = q.errors || jsonb_build_array(jsonb_build_object(
        'attempt', q.attempts, 'at', now(), 'worker', q.worker_id, 'type', 'WorkerLost',
        'message', CASE WHEN lost.spent
            THEN format('the worker running this job stopped (loss %%s of %%s allowed); the job failed',
                        lost.losses, lost.allowed)
            WHEN lost.unstarted
            THEN 'the worker holding this job stopped before starting it; the job was queued again, no attempt used'
            ELSE format('the worker running this job stopped (loss %%s of %%s allowed); '
                        'the job was queued again, no attempt used', lost.losses, lost.allowed) END,
        'traceback', ''))
FROM lost
WHERE q.id = lost.id AND q.id = ANY(ARRAY(SELECT id FROM lost))
RETURNING q.id, q.status
"""

# The ids again as an array (an InitPlan) give the UPDATE an index condition on the primary
# key: with statistics that saw a small table (a queue drained, then emptied), the planner
# joined lost to a walk of the whole primary key, which under a held snapshot read every
# dead row (31,000 buffers for 3 rows: tests/test_paced_housekeeping.py).

# The rescue at the beats between sweeps: only the rows of workers whose lease ran out, by their ids
# through axa_queue_running (a walk of those workers' entries alone). RESCUE also walks the
# whole index for rows whose worker is gone (unregistered with its jobs still running, or
# passed over locked when its worker was taken for dead) and stale seed rows; under a held
# snapshot that walk reads every row the queue ran since, so the watchman paces it
# (worker/pacing.py) and runs this in between.
_ANY_WORKER = """(
        (q.worker_id IS NOT NULL AND (
            q.worker_id IN (SELECT id FROM dead)
            OR NOT EXISTS (SELECT 1 FROM axa_worker w WHERE w.id = q.worker_id)))
        OR (q.worker_id IS NULL AND q.started_at < now() - make_interval(mins => %(stale)s)))"""
assert RESCUE.count(_ANY_WORKER) == 1, "RESCUE changed shape"
RESCUE_DEAD = RESCUE.replace(_ANY_WORKER, "(q.worker_id = ANY(ARRAY(SELECT id FROM dead)))")

# Rows running under this worker that it no longer holds: a crash or a failover lost what
# the worker wrote of them (an outcome, a release; sent without waiting for the flush)
# while their claim survived, and the rescue, which takes dead workers' rows, would leave
# them running for ever. Queued again with their attempt given back: the outcome is gone,
# so the job runs again (at least once). Rows changed in the last %(grace)s seconds are
# left: a claim just made may not be in the worker's ledger yet. Through axa_queue_running
# (its dead entries are read too): run after a reconnect and once a minute, not per beat.
RECONCILE = """
WITH stray AS (
    SELECT id FROM ONLY axa_queue
    WHERE worker_id = %(worker)s AND status = 'running' AND NOT (id = ANY(%(held)s::uuid[]))
      AND updated_at < now() - make_interval(secs => %(grace)s)
    FOR UPDATE SKIP LOCKED
)
UPDATE ONLY axa_queue q
SET status = 'queued', started_at = NULL, worker_id = NULL, run_at = now(), updated_at = now(),
    attempts = GREATEST(q.attempts - 1, 0),
    errors = q.errors || jsonb_build_array(jsonb_build_object(
        'attempt', q.attempts, 'at', now(), 'worker', q.worker_id, 'type', 'OutcomeLost',
        'message', 'the worker running this job no longer held it: the database lost what the worker wrote '
            'of it (a crash or a failover); the job was queued again, no attempt used',
        'traceback', ''))
FROM stray WHERE q.id = stray.id
RETURNING q.id
"""

# A queued row whose run_at is 'infinity', or after year 9999 (which Python cannot hold
# either), can never become due: fail it, saying why, and give it a finite run_at so that
# every reader of the row can load it.
FAIL_NEVER_DUE = """
WITH never AS (
    SELECT id, 'run_at was ' || CASE WHEN run_at = 'infinity' THEN '''infinity''' ELSE run_at::text END
        || ', so this job could never run' AS why
    FROM ONLY axa_queue WHERE status = 'queued' AND run_at >= '10000-01-01 00:00:00+00'
)
UPDATE ONLY axa_queue q
SET status = 'failed', run_at = now(), finished_at = now(), updated_at = now(),
    error = 'NeverDue: ' || never.why || '; enqueue it again with a real time',
    errors = q.errors || jsonb_build_array(jsonb_build_object(
        'attempt', q.attempts, 'at', now(), 'worker', NULL, 'type', 'NeverDue', 'message', never.why, 'traceback', ''))
FROM never WHERE q.id = never.id AND q.status = 'queued'
RETURNING q.id
"""

# Give back jobs this worker will not finish (hard shutdown).
RELEASE = """
UPDATE ONLY axa_queue
SET status = 'queued', started_at = NULL, worker_id = NULL, run_at = now(), updated_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts, 'at', now(), 'worker', worker_id, 'type', 'Interrupted',
        'message', 'the worker was stopped before this job finished; the job was queued again',
        'traceback', ''))
WHERE id = ANY(%(ids)s::uuid[]) AND status || '' = 'running' AND worker_id IS NOT DISTINCT FROM %(worker)s
"""

# Record when threads started rows claimed ahead (their started_at is NULL until then).
# By id alone (IS NOT DISTINCT FROM keeps axa_queue_running out of the plan: under a held
# snapshot it holds every row this worker ever ran). A row locked meanwhile is passed
# over, never waited for: a job completing itself in
# its own transaction (COMPLETE_SELF) holds its row until that commits, and writes
# started_at itself; the dispatcher must not stop claiming behind it.
MARK_STARTED = f"""
UPDATE ONLY axa_queue q SET started_at = to_timestamp(v.at)
FROM unnest(%(ids)s::uuid[], %(at)s::float8[]) AS v(id, at)
WHERE q.id = v.id AND q.id = ANY(ARRAY(
    SELECT l.id FROM ONLY axa_queue l
    WHERE l.id = ANY(%(ids)s::uuid[]) AND l.status || '' = 'running' AND l.worker_id IS NOT DISTINCT FROM %(worker)s
      AND l.started_at IS NULL
    FOR UPDATE SKIP LOCKED
))
RETURNING {NO_FLUSH}
"""

# Give back rows claimed ahead that no thread started (a stopping worker): queued as
# before the claim, the attempt it counted taken back. Their run_at lies behind other
# workers' floors (worker/lanes.py): the notification makes them walk from the start.
UNCLAIM = """
WITH given AS (
    UPDATE ONLY axa_queue
    SET status = 'queued', started_at = NULL, worker_id = NULL, attempts = GREATEST(attempts - 1, 0),
        updated_at = now()
    WHERE id = ANY(%(ids)s::uuid[]) AND status || '' = 'running' AND worker_id IS NOT DISTINCT FROM %(worker)s
    RETURNING id
)
SELECT count(*), pg_notify('axa_queue', 'rescan') FROM given HAVING count(*) > 0
"""

UNREGISTER = "DELETE FROM axa_worker WHERE id = %(worker)s"

WAKE = "SELECT pg_notify('axa_queue', '')"
# Rows became ready with a run_at that may lie behind the claims' floors (worker/lanes.py):
# every worker's next claim walks from the start.
RESCAN = "SELECT pg_notify('axa_queue', 'rescan')"

# Resume a queue: the row goes, and idle workers wake at once (delivered at commit).
RESUME = """
WITH gone AS (DELETE FROM axa_paused_queue WHERE queue = %(queue)s RETURNING queue)
SELECT count(*), pg_notify('axa_queue', 'rescan') FROM gone
"""

# Run before a housekeeping statement, in its transaction: none may hold the
# dispatcher (or the heartbeat) for long. Sequential and bitmap scans are back on for it:
# worker sessions plan without them so that no claim is cached as one (worker/connection.py, connect), but
# housekeeping reads small tables whole, and without them its plans went astray
# (RESCUE took 1-2 s instead of a millisecond).
TIMEOUTS = (
    "SELECT set_config('statement_timeout', %(statement)s, true), set_config('lock_timeout', %(lock)s, true), "
    "set_config('enable_seqscan', 'on', true), set_config('enable_bitmapscan', 'on', true)"
)

# Ready rows no live worker claims: per (queue, name) of background jobs and per
# (queue, backend) of django.tasks rows. Loose index scans over the queue claim
# indexes find the distinct pairs in one descent each (at most %(pairs)s of them),
# whatever the table holds; a pair's kind is its best row's; the ready rows of a pair
# no live worker covers are counted through the same index, at most %(cap)s. "name >= ''"
# (true of every row) says the (queue, name) index's "name IS NOT NULL" (models.py):
# without it the walk over names took axa_queue_claim_all_queue and sorted each queue's
# rows; said as IS NOT NULL, PostgreSQL 17 and later drop it (name is NOT NULL) first.
UNHANDLED = """
WITH RECURSIVE names AS (
    (SELECT 1 AS n, queue, name, backend IS NOT NULL AS task FROM ONLY axa_queue
     WHERE status BETWEEN 'queued' AND 'queued' AND name >= ''
     ORDER BY queue, name, priority DESC, run_at LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue, x.name, x.task FROM names p CROSS JOIN LATERAL (
        SELECT queue, name, backend IS NOT NULL AS task FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name >= '' AND (queue, name) > (p.queue, p.name)
        ORDER BY queue, name, priority DESC, run_at LIMIT 1
    ) AS x WHERE p.n < %(pairs)s
), backends AS (
    (SELECT 1 AS n, queue, backend FROM ONLY axa_queue
     WHERE status BETWEEN 'queued' AND 'queued' AND backend IS NOT NULL ORDER BY queue, backend LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue, x.backend FROM backends p CROSS JOIN LATERAL (
        SELECT queue, backend FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND backend IS NOT NULL AND (queue, backend) > (p.queue, p.backend)
        ORDER BY queue, backend LIMIT 1
    ) AS x WHERE p.n < %(pairs)s
), live AS (
    SELECT names, backends, queues FROM axa_worker
    WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)
), found AS (
    SELECT p.name, NULL::text AS backend, p.queue, (
        SELECT count(*) FROM (
            SELECT 1 FROM ONLY axa_queue q
            WHERE q.status BETWEEN 'queued' AND 'queued' AND q.queue = p.queue AND q.name = p.name AND q.run_at <= now()
            LIMIT %(cap)s) AS c) AS ready
    FROM names p
    WHERE NOT p.task AND NOT EXISTS (
        SELECT 1 FROM live w WHERE w.names ? p.name AND (w.queues = '[]'::jsonb OR w.queues ? p.queue))
    UNION ALL
    SELECT NULL, p.backend, p.queue, (
        SELECT count(*) FROM (
            SELECT 1 FROM ONLY axa_queue q
            WHERE q.status BETWEEN 'queued' AND 'queued' AND q.backend IS NOT NULL AND q.queue = p.queue
              AND q.backend = p.backend AND q.run_at <= now()
            LIMIT %(cap)s) AS c)
    FROM backends p
    WHERE NOT EXISTS (
        SELECT 1 FROM live w WHERE w.backends ? p.backend AND (w.queues = '[]'::jsonb OR w.queues ? p.queue))
)
SELECT name, backend, queue, ready FROM found WHERE ready > 0 ORDER BY ready DESC, name, backend, queue
"""

# FINISH for jobs with children, run in a transaction with dependencies.SETTLE: the ids
# it wrote, whose children to settle, each retry's status beside its id (as FINISH reports
# them: failed through max_losses, cancelled by the requeue guard), NULL for a row moved.
_PARENT_WRITES = _FINISH_WRITES.replace("\n  AND NOT q.has_children\n", "\n")
assert _PARENT_WRITES != _FINISH_WRITES, "FINISH lost its no-children guard"
FINISH_PARENTS = f"""{_PARENT_WRITES}SELECT id, {NO_FLUSH}, NULL::text FROM moved
UNION ALL SELECT id, {NO_FLUSH}, status FROM retried
"""

# A job completing itself (JobContext.complete_in_transaction), in the job's own
# transaction on the queue database: the row is completed with the job's writes there,
# or not at all. Guarded as FINISH is: only while the row is running under this worker,
# so a worker that lost the row (rescued, deleted) completes nothing and a completed row
# cannot be completed again. No synchronous_commit here: the transaction is the job's.
COMPLETE_SELF = """
UPDATE ONLY axa_queue
SET status = 'completed', result = %(result)s::jsonb, finished_at = now(), updated_at = now(),
    started_at = COALESCE(started_at, to_timestamp(%(started)s))
WHERE id = %(id)s AND status || '' = 'running' AND worker_id IS NOT DISTINCT FROM %(worker)s
RETURNING has_children
"""
