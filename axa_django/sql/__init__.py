"""The statements the worker runs, kept together so their guards can be read side by side.

Templates hold ``{names}``, ``{backends}`` and ``{queues}`` slots that the worker fills
once with literals (``compose``); ``%(...)s`` are parameters bound per execution.
Statements that write end their RETURNING with ``set_config('synchronous_commit',
'off', true)``: that transaction alone skips the WAL flush, and no session setting
is left on a connection a pooler may hand to someone else.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import psycopg.sql

# Claim up to %(limit)s ready jobs, per name best first, in one statement. The LATERAL
# walk per name (per name and queue for a --queue worker) keeps the cost flat however
# many rows other names or queues hold. The ids are gathered in ARRAY(...), an InitPlan
# run once, so no join order can re-run the locking subquery and claim past the LIMIT.
# django.tasks rows (backend set) are walked per backend alias instead, any task path:
# the worker resolves their task and refuses anything that is not one (taskrunner.py).
# attempts stops short of int overflow so that no row can make the claim fail, and a
# run_at of '-infinity' becomes the claim's time, which Python (and the admin) can load.
# started_at is set at once unless %(ahead)s (rows claimed ahead of free threads): then
# it is written when a thread has started the job (MARK_STARTED, FINISH), and a row a
# dead worker held without starting is queued again without losing an attempt. A row
# with history (an error, a rescue) is marked at once, so that a job that kills its
# worker counts a loss from its second try on and cannot loop for ever.
# The rows are found by their ids alone: the walk has locked them, still queued, so
# nothing can change them before the UPDATE, and with no status test the planner has
# only the primary key to find them by. With one, a generic plan made while the
# statistics said nothing was queued walked the whole ready index for the ids.
# RETURNING comes in no particular order: the worker sorts by priority and run_at.
# What a claim writes and returns, shared with the limited claim (sqlflow.py).
CLAIMED = """
SET status = 'running', updated_at = now(),
    started_at = CASE WHEN NOT %(ahead)s OR q.errors <> '[]'::jsonb THEN now() END,
    attempts = LEAST(q.attempts, 2147483646) + 1, worker_id = %(worker)s, cancel_requested = false,
    run_at = CASE WHEN q.run_at = '-infinity' THEN now() ELSE q.run_at END"""
CLAIM_RETURNING = """
RETURNING q.id, q.name, q.args::text, q.attempts, q.max_attempts, q.backend, q.started_at IS NULL,
    q.priority, q.run_at, set_config('synchronous_commit', 'off', true), q.timeout, now()
"""
CLAIM = f"""
UPDATE axa_queue q{CLAIMED}
WHERE q.id = ANY(ARRAY(
    SELECT c.id FROM ({{walks}}) AS c
    ORDER BY c.priority DESC, c.run_at
    LIMIT %(limit)s
)){CLAIM_RETURNING}"""
# Both claims of background jobs report their snapshot (worker/lanes.py): its oldest
# running transaction id, its next one and its time, on a row of their own (id NULL)
# after the claimed rows, so that an empty claim reports it too.
_SNAPPED = """
WITH claimed AS ({claim}), snap AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS xmin,
        pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xmax, now() AS at
)
SELECT c.*, NULL::int8, NULL::int8, NULL::timestamptz FROM claimed c
UNION ALL
SELECT NULL::uuid, NULL, NULL, NULL::int, NULL::int, NULL, NULL::bool, NULL::int, NULL::timestamptz, NULL,
    NULL::float8, NULL::timestamptz, snap.xmin, snap.xmax, snap.at FROM snap
"""
CLAIM_FULL = _SNAPPED.replace("{claim}", CLAIM)
CLAIM_LANES = _SNAPPED.replace("{claim}", CLAIM.replace("{walks}", "{lane_walks}"))
# "status BETWEEN 'queued' AND 'queued'" is how the claims say queued: only the claim
# indexes are built for it (models.py), so no plan can take the seed's ready index.
_NAME_WALK = """
    SELECT c.id, c.priority, c.run_at FROM unnest({names}::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = n.name AND backend IS NULL AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""
_BACKEND_WALK = """
    SELECT t.id, t.priority, t.run_at FROM unnest({backends}::text[]) AS b(backend)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND backend = b.backend AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS t"""

# The same claim walking each lane (a name and a priority) from a floor (worker/lanes.py):
# rows whose claims left dead index entries behind the floor are never walked, however
# old the oldest snapshot is. Priorities between the known lanes (and above and below
# them) are walked from their start, so a lane not seen yet is found at once.
# %(floors)s holds one floor per lane, in the order of {lane_names}.
_LANE_WALK = """
    SELECT c.id, c.priority, c.run_at
    FROM unnest({lane_names}::text[], {lane_priorities}::int[], %(floors)s::timestamptz[]) AS l(name, priority, floor)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = l.name AND priority = l.priority AND backend IS NULL
          AND run_at >= l.floor AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""
_GAP_WALK = """
    SELECT c.id, c.priority, c.run_at
    FROM unnest({gap_names}::text[], {gap_above}::int8[], {gap_below}::int8[]) AS g(name, above, below)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = g.name AND priority > g.above AND priority < g.below
          AND backend IS NULL AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""

# Seconds until the earliest future job this worker could run, or NULL; capped at a
# day so that a row with run_at = 'infinity' cannot make an infinite wait.
NEXT_RUN = """
SELECT extract(epoch FROM LEAST(min(run_at), now() + interval '1 day') - now())::float8 FROM axa_queue
WHERE status = 'queued' AND run_at > now() {queue_filter} {paused}
  AND ((backend IS NULL AND name = ANY({names}::text[])) OR backend = ANY({backends}::text[]))
"""

# Paused queues (axa_paused_queue) are skipped in the claim itself, so a pause holds for
# every worker at once. A --queue walk is cut off whole: its NOT EXISTS has no outer
# reference, so PostgreSQL runs it once as a one-time filter and, while the queue is
# paused, never enters the walk. A walk over all queues reads the paused set once
# (an InitPlan) and filters on it; with nothing paused that is a test against an
# empty array. COALESCE keeps the planner's default estimate for that filter: bare,
# `<> ALL` of an unknown array reads as so selective that the planner sorts the ready
# index instead of walking the claim index (measured). (The seed's CLAIM, run by a
# Rust worker, knows nothing of pauses.)
PAUSED_ONE = "AND queue = {slot} AND NOT EXISTS (SELECT FROM axa_paused_queue p WHERE p.queue = {slot})"
PAUSED_ANY = "AND COALESCE(queue <> ALL(ARRAY(SELECT p.queue FROM axa_paused_queue p)), true)"
# The plain CLAIM's walks also pass over queues with a fleet-wide limit (axa_queue_limit):
# sqlqueues.py claims those, counting each queue's running rows under its lock. Read in
# the statement itself, a limit set a moment ago holds for every worker at once.
HELD_ONE = PAUSED_ONE + " AND NOT EXISTS (SELECT FROM axa_queue_limit l WHERE l.queue = {slot})"
HELD_ANY = (
    "AND COALESCE(queue <> ALL(ARRAY(SELECT p.queue FROM axa_paused_queue p "
    "UNION ALL SELECT l.queue FROM axa_queue_limit l)), true)"
)

_SLOT = re.compile(r"\{(names|backends|queue_\d+|queues|limited|lane_names|lane_priorities|gap_\w+)\}")
_NO_PRIORITY_ABOVE, _NO_PRIORITY_BELOW = -(2**31) - 1, 2**31


def _gaps(names: list[str], lanes: Sequence[tuple[str, int]]) -> dict[str, list[Any]]:
    """Per name, the open ranges of priorities between its known lanes (all of them for a name with none)."""
    gaps: dict[str, list[Any]] = {"gap_names": [], "gap_above": [], "gap_below": []}
    for name in names:
        bounds = [_NO_PRIORITY_ABOVE, *sorted(p for n, p in lanes if n == name), _NO_PRIORITY_BELOW]
        for above, below in itertools.pairwise(bounds):
            if below - above > 1:
                gaps["gap_names"].append(name)
                gaps["gap_above"].append(above)
                gaps["gap_below"].append(below)
    return gaps


def compose(
    template: str,
    names: list[str],
    backends: list[str],
    queues: list[str] | None,
    limited: list[str] | None = None,
    lanes: Sequence[tuple[str, int]] = (),
) -> str:
    """``template`` with the worker's fixed names, backends and queues written in as literals.

    A --queue worker walks each of its queues apart, its name written in, so that the
    planner sees how few rows that queue holds and takes the per-queue index. One
    pass over the text: a value is never scanned again, so a name such as
    ``%(queues)s`` or ``{names}`` stays data. ``%`` is doubled so that psycopg leaves
    it alone while binding the statement's own parameters.
    """
    values: dict[str, Any] = {"names": names, "backends": backends, "queues": queues or [], "limited": limited or []}
    filters = [HELD_ANY]
    if queues:
        filters = [HELD_ONE.format(slot=f"{{queue_{index}}}") for index in range(len(queues))]
        values.update({f"queue_{index}": queue for index, queue in enumerate(queues)})
    walks = [walk.replace("{queue}", f) for walk in (_NAME_WALK, _BACKEND_WALK) for f in filters]
    text = template.replace("{walks}", "\n    UNION ALL".join(walks))
    if "{lane_walks}" in text:
        lanes = [lane for lane in lanes if lane[0] in names]
        values.update(_gaps(names, lanes), lane_names=[n for n, _ in lanes], lane_priorities=[p for _, p in lanes])
        kinds = ([_LANE_WALK] if lanes else []) + ([_GAP_WALK] if values["gap_names"] else []) + [_BACKEND_WALK]
        walks = [walk.replace("{queue}", f) for walk in kinds for f in filters]
        text = text.replace("{lane_walks}", "\n    UNION ALL".join(walks))
    text = text.replace("{queue_filter}", "AND queue = ANY({queues}::text[])" if queues else "")
    text = text.replace("{paused}", PAUSED_ANY)

    def literal(match: re.Match[str]) -> str:
        return psycopg.sql.Literal(values[match.group(1)]).as_string(None).replace("%", "%%")

    return _SLOT.sub(literal, text)


# Statements that find rows by id say "running" as status || '' = 'running' and compare
# worker_id with IS NOT DISTINCT FROM: no index can take either, so the rows are found
# by primary key alone. Through axa_queue_running or axa_queue_status, a plan would read
# the entry of every row that was ever running, which a held snapshot keeps (worker/lanes.py).

# Record outcomes; a row is only written while still running under this worker. The
# batch comes as one JSON array (execution.finish), a single parameter to send: the
# result nested as {"v": ...} so that a JSON null stays a JSON null. A job with
# children is left out: dependencies.finish_parents writes it and settles its children
# in one transaction (FINISH_PARENTS), so a childless job costs nothing more.
FINISH = """
UPDATE axa_queue q
SET status = v.status,
    error = CASE WHEN v.status = 'completed' THEN q.error ELSE v.error END,
    result = v.result -> 'v',
    errors = CASE WHEN v.entry IS NULL THEN q.errors ELSE q.errors || jsonb_build_array(v.entry) END,
    run_at = CASE WHEN v.status = 'queued' THEN now() + make_interval(secs => v.delay) ELSE q.run_at END,
    started_at = CASE WHEN v.status = 'queued' THEN NULL ELSE COALESCE(q.started_at, to_timestamp(v.started)) END,
    worker_id = CASE WHEN v.status = 'queued' THEN NULL ELSE q.worker_id END,
    finished_at = CASE WHEN v.status = 'queued' THEN NULL ELSE now() END,
    updated_at = now()
FROM jsonb_to_recordset(%(outcomes)s::jsonb)
    AS v(id uuid, status text, error text, result jsonb, entry jsonb, delay float8, started float8)
WHERE q.id = v.id AND q.status || '' = 'running' AND q.worker_id IS NOT DISTINCT FROM %(worker)s
  AND NOT q.has_children
RETURNING q.id, set_config('synchronous_commit', 'off', true)
"""

REGISTER = """
INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at)
VALUES (%(worker)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s::jsonb, %(names)s::jsonb,
        %(backends)s::jsonb, now(), now())
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
"""

# Heartbeat, and collect cancellations asked of this worker's running jobs. The jobs are
# found by their ids (the worker's in flight), never through axa_queue_running by worker
# id: under a held snapshot, that walk reads every row this worker ever ran, and a
# heartbeat slowed past its timeout would have the worker taken for dead.
HEARTBEAT = """
WITH beat AS (UPDATE axa_worker SET heartbeat_at = now() WHERE id = %(worker)s RETURNING id)
SELECT (SELECT count(*) FROM beat),
       ARRAY(SELECT id FROM axa_queue
             WHERE id = ANY(%(ids)s::uuid[]) AND worker_id IS NOT DISTINCT FROM %(worker)s
               AND status || '' = 'running' AND cancel_requested),
       set_config('synchronous_commit', 'off', true)
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
    FROM axa_queue q
    WHERE q.status = 'running' AND (
        (q.worker_id IS NOT NULL AND (
            q.worker_id IN (SELECT id FROM dead)
            OR NOT EXISTS (SELECT 1 FROM axa_worker w WHERE w.id = q.worker_id)))
        OR (q.worker_id IS NULL AND q.started_at < now() - make_interval(mins => %(stale)s)))
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE axa_queue q
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
WHERE q.id = lost.id
RETURNING q.id, q.status
"""

# A queued row whose run_at is 'infinity' can never become due: fail it, saying why,
# and give it a finite run_at so that every reader of the row can load it.
FAIL_NEVER_DUE = """
UPDATE axa_queue
SET status = 'failed', run_at = now(), finished_at = now(), updated_at = now(),
    error = 'NeverDue: run_at was ''infinity'', so this job could never run; enqueue it again with a real time',
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts, 'at', now(), 'worker', NULL, 'type', 'NeverDue',
        'message', 'run_at was ''infinity'', so this job could never run', 'traceback', ''))
WHERE status = 'queued' AND run_at = 'infinity'
RETURNING id
"""

# Give back jobs this worker will not finish (hard shutdown).
RELEASE = """
UPDATE axa_queue
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
MARK_STARTED = """
UPDATE axa_queue q SET started_at = to_timestamp(v.at)
FROM unnest(%(ids)s::uuid[], %(at)s::float8[]) AS v(id, at)
WHERE q.id = v.id AND q.id = ANY(ARRAY(
    SELECT l.id FROM axa_queue l
    WHERE l.id = ANY(%(ids)s::uuid[]) AND l.status || '' = 'running' AND l.worker_id IS NOT DISTINCT FROM %(worker)s
      AND l.started_at IS NULL
    FOR UPDATE SKIP LOCKED
))
RETURNING set_config('synchronous_commit', 'off', true)
"""

# Give back rows claimed ahead that no thread started (a stopping worker): queued as
# before the claim, the attempt it counted taken back. Their run_at lies behind other
# workers' floors (worker/lanes.py): the notification makes them walk from the start.
UNCLAIM = """
WITH given AS (
    UPDATE axa_queue
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
# no live worker covers are counted through the same index, at most %(cap)s.
UNHANDLED = """
WITH RECURSIVE names AS (
    (SELECT 1 AS n, queue, name, backend IS NOT NULL AS task FROM axa_queue
     WHERE status BETWEEN 'queued' AND 'queued' ORDER BY queue, name, priority DESC, run_at LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue, x.name, x.task FROM names p CROSS JOIN LATERAL (
        SELECT queue, name, backend IS NOT NULL AS task FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND (queue, name) > (p.queue, p.name)
        ORDER BY queue, name, priority DESC, run_at LIMIT 1
    ) AS x WHERE p.n < %(pairs)s
), backends AS (
    (SELECT 1 AS n, queue, backend FROM axa_queue
     WHERE status BETWEEN 'queued' AND 'queued' AND backend IS NOT NULL ORDER BY queue, backend LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue, x.backend FROM backends p CROSS JOIN LATERAL (
        SELECT queue, backend FROM axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND backend IS NOT NULL AND (queue, backend) > (p.queue, p.backend)
        ORDER BY queue, backend LIMIT 1
    ) AS x WHERE p.n < %(pairs)s
), live AS (
    SELECT names, backends, queues FROM axa_worker
    WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)
), found AS (
    SELECT p.name, NULL::text AS backend, p.queue, (
        SELECT count(*) FROM (
            SELECT 1 FROM axa_queue q
            WHERE q.status BETWEEN 'queued' AND 'queued' AND q.queue = p.queue AND q.name = p.name AND q.run_at <= now()
            LIMIT %(cap)s) AS c) AS ready
    FROM names p
    WHERE NOT p.task AND NOT EXISTS (
        SELECT 1 FROM live w WHERE w.names ? p.name AND (w.queues = '[]'::jsonb OR w.queues ? p.queue))
    UNION ALL
    SELECT NULL, p.backend, p.queue, (
        SELECT count(*) FROM (
            SELECT 1 FROM axa_queue q
            WHERE q.status BETWEEN 'queued' AND 'queued' AND q.backend IS NOT NULL AND q.queue = p.queue
              AND q.backend = p.backend AND q.run_at <= now()
            LIMIT %(cap)s) AS c)
    FROM backends p
    WHERE NOT EXISTS (
        SELECT 1 FROM live w WHERE w.backends ? p.backend AND (w.queues = '[]'::jsonb OR w.queues ? p.queue))
)
SELECT name, backend, queue, ready FROM found WHERE ready > 0 ORDER BY ready DESC, name, backend, queue
"""

# Queue failed jobs again, in one statement. A unique key held by a queued or running
# job, or wanted by two rows of the batch, would break axa_queue_unique (ON CONFLICT
# does not apply to UPDATE): such rows stay failed and come back with the holder's id.
# Rows out: (id, true, NULL) for each job retried, (id, false, holder) for each one skipped.
RETRY = """
WITH candidate AS (
    SELECT q.id, q.name, q.unique_key, q.finished_at FROM axa_queue q
    {candidates} AND q.status = 'failed'
    FOR UPDATE
), ranked AS (
    SELECT c.id,
        (SELECT l.id FROM axa_queue l
         WHERE l.name = c.name AND l.unique_key = c.unique_key AND l.status IN ('queued', 'running')
         LIMIT 1) AS live,
        CASE WHEN c.unique_key IS NULL THEN c.id ELSE first_value(c.id) OVER (
            PARTITION BY c.name, c.unique_key ORDER BY c.finished_at DESC NULLS LAST, c.id
        ) END AS first
    FROM candidate c
), retried AS (
    UPDATE axa_queue q
    SET status = 'queued', run_at = now(), started_at = NULL, finished_at = NULL,
        worker_id = NULL, attempts = 0, losses = 0, updated_at = now()
    FROM ranked r
    WHERE q.id = r.id AND r.live IS NULL AND r.first = r.id
    RETURNING q.id
)
SELECT id, true, NULL::uuid FROM retried
UNION ALL
SELECT id, false, coalesce(live, first) FROM ranked WHERE live IS NOT NULL OR first <> id
"""

# FINISH for jobs with children, run in a transaction with dependencies.SETTLE.
FINISH_PARENTS = FINISH.replace("\n  AND NOT q.has_children\n", "\n")
assert FINISH_PARENTS != FINISH, "FINISH lost its no-children guard"

# A job completing itself (JobContext.complete_in_transaction), in the job's own
# transaction on the queue database: the row is completed with the job's writes there,
# or not at all. Guarded as FINISH is: only while the row is running under this worker,
# so a worker that lost the row (rescued, deleted) completes nothing and a completed row
# cannot be completed again. No synchronous_commit here: the transaction is the job's.
COMPLETE_SELF = """
UPDATE axa_queue
SET status = 'completed', result = %(result)s::jsonb, finished_at = now(), updated_at = now(),
    started_at = COALESCE(started_at, to_timestamp(%(started)s))
WHERE id = %(id)s AND status || '' = 'running' AND worker_id IS NOT DISTINCT FROM %(worker)s
RETURNING has_children
"""
