"""The statements the worker runs, kept together so their guards can be read side by side."""

# Claim up to %(limit)s ready jobs, per name best first, in one statement. The LATERAL
# walk per name keeps the cost flat however many rows other names have queued.
# django.tasks rows (backend set) are walked per backend alias instead, any task path:
# the worker imports their task and refuses anything that is not one (taskrunner.py).
CLAIM = """
UPDATE axa_queue q
SET status = 'running', started_at = now(), updated_at = now(),
    attempts = q.attempts + 1, worker_id = %(worker)s, cancel_requested = false
FROM (
    SELECT c.id FROM (
        SELECT c.id, c.priority, c.run_at FROM unnest(%(names)s::text[]) AS n(name)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM axa_queue
            WHERE status = 'queued' AND name = n.name AND backend IS NULL AND run_at <= now() {queues}
            ORDER BY priority DESC, run_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS c
        UNION ALL
        SELECT t.id, t.priority, t.run_at FROM unnest(%(backends)s::text[]) AS b(backend)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM axa_queue
            WHERE status = 'queued' AND backend = b.backend AND run_at <= now() {queues}
            ORDER BY priority DESC, run_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS t
    ) AS c
    ORDER BY c.priority DESC, c.run_at
    LIMIT %(limit)s
) AS picked
WHERE q.id = picked.id
RETURNING q.id, q.name, q.args, q.attempts, q.max_attempts, q.backend
"""
CLAIM_QUEUES = "AND queue = ANY(%(queues)s::text[])"

# Seconds until the earliest future job this worker could run, or NULL.
NEXT_RUN = """
SELECT extract(epoch FROM min(run_at) - now()) FROM axa_queue
WHERE status = 'queued' AND run_at > now() {queues}
  AND ((backend IS NULL AND name = ANY(%(names)s::text[])) OR backend = ANY(%(backends)s::text[]))
"""

# Record outcomes; a row is only written while still running under this worker.
FINISH = """
UPDATE axa_queue q
SET status = v.status,
    error = CASE WHEN v.status = 'completed' THEN q.error ELSE v.error END,
    result = v.result::jsonb,
    errors = CASE WHEN v.entry IS NULL THEN q.errors ELSE q.errors || jsonb_build_array(v.entry::jsonb) END,
    run_at = CASE WHEN v.status = 'queued' THEN now() + make_interval(secs => v.delay) ELSE q.run_at END,
    started_at = CASE WHEN v.status = 'queued' THEN NULL ELSE q.started_at END,
    worker_id = CASE WHEN v.status = 'queued' THEN NULL ELSE q.worker_id END,
    finished_at = CASE WHEN v.status = 'queued' THEN NULL ELSE now() END,
    updated_at = now()
FROM unnest(%(ids)s::uuid[], %(statuses)s::text[], %(errors)s::text[], %(results)s::text[],
            %(entries)s::text[], %(delays)s::float8[]) AS v(id, status, error, result, entry, delay)
WHERE q.id = v.id AND q.status = 'running' AND q.worker_id IS NOT DISTINCT FROM %(worker)s
RETURNING q.id
"""

REGISTER = """
INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, started_at, heartbeat_at)
VALUES (%(worker)s, %(hostname)s, %(pid)s, %(concurrency)s, %(queues)s::jsonb, now(), now())
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
"""

# Heartbeat, and collect cancellations asked of this worker's running jobs.
HEARTBEAT = """
WITH beat AS (UPDATE axa_worker SET heartbeat_at = now() WHERE id = %(worker)s RETURNING id)
SELECT (SELECT count(*) FROM beat),
       ARRAY(SELECT id FROM axa_queue
             WHERE worker_id = %(worker)s AND status = 'running' AND cancel_requested)
"""

# Requeue jobs of dead workers (no heartbeat within the lease), and rows claimed
# without a worker id (the seed's CLAIM) that have run past STALE_MINUTES.
RESCUE = """
WITH dead AS (
    DELETE FROM axa_worker WHERE heartbeat_at < now() - make_interval(secs => %(lease)s) RETURNING id
)
UPDATE axa_queue q
SET status = 'queued', started_at = NULL, worker_id = NULL, run_at = now(), updated_at = now(),
    errors = q.errors || jsonb_build_array(jsonb_build_object(
        'attempt', q.attempts, 'at', now(), 'worker', q.worker_id, 'type', 'WorkerLost',
        'message', 'the worker running this job stopped; the job was queued again', 'traceback', ''))
WHERE q.status = 'running' AND (
    (q.worker_id IS NOT NULL AND (
        q.worker_id IN (SELECT id FROM dead)
        OR NOT EXISTS (SELECT 1 FROM axa_worker w WHERE w.id = q.worker_id)))
    OR (q.worker_id IS NULL AND q.started_at < now() - make_interval(mins => %(stale)s)))
RETURNING q.id
"""

# Give back jobs this worker will not finish (hard shutdown).
RELEASE = """
UPDATE axa_queue
SET status = 'queued', started_at = NULL, worker_id = NULL, run_at = now(), updated_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts, 'at', now(), 'worker', worker_id, 'type', 'Interrupted',
        'message', 'the worker was stopped before this job finished; the job was queued again',
        'traceback', ''))
WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running' AND worker_id = %(worker)s
"""

UNREGISTER = "DELETE FROM axa_worker WHERE id = %(worker)s"

WAKE = "SELECT pg_notify('axa_queue', '')"
