"""Queue failed jobs again (the admin's retry, ``JobQuerySet.retry``, bulk retries), in one statement.

A unique key held by a queued or running job, or wanted by two rows of the batch, would
break axa_queue_unique (ON CONFLICT does not apply to UPDATE): such rows stay failed and
come back with the holder's id. Rows out: (id, true, NULL) for each job retried,
(id, false, holder) for each one skipped. ``{candidates}`` is the WHERE naming the jobs.

A failed job is nearly always in a history table. Updating it there and letting
``axa_history_revive`` move it cost a new version of the row with its index entries in
the history, then, per row, a statement planned afresh (the trigger's dynamic DELETE) and
an INSERT whose statement triggers ran once per row: 0.16 ms a row, most of a bulk
retry's cost beside a draining worker. Here the history's rows are deleted and inserted
into ``axa_queue`` as sets, as the worker's FINISH moves them the other way; rows a
refused move left finished in place in ``axa_queue`` are updated there.
"""

from __future__ import annotations

from . import HISTORY_COLUMNS

# What a retry changes; every other column is carried over as it was.
_RESET = {
    "status": "'queued'",
    "run_at": "now()",
    "started_at": "NULL",
    "finished_at": "NULL",
    "worker_id": "NULL",
    "attempts": "0",
    "losses": "0",
    "updated_at": "now()",
}
_COLUMNS = [column.strip() for column in HISTORY_COLUMNS.split(",")]
assert set(_RESET) <= set(_COLUMNS), "a column a retry resets is not in HISTORY_COLUMNS"
_SET = ", ".join(f"{column} = {value}" for column, value in _RESET.items())
_MOVED = ", ".join(_RESET.get(column, f"g.{column}") for column in _COLUMNS)

# The doubled braces survive sql.RETRY's own str.format for the candidates.
RETRY = f"""
WITH candidate AS (
    SELECT q.id, q.name, q.unique_key, q.finished_at, q.tableoid AS home FROM axa_queue q
    {{candidates}} AND q.status = 'failed'
    FOR UPDATE
), ranked AS (
    SELECT c.id, c.home,
        (SELECT l.id FROM axa_queue l
         WHERE l.name = c.name AND l.unique_key = c.unique_key AND l.status IN ('queued', 'running')
         LIMIT 1) AS live,
        CASE WHEN c.unique_key IS NULL THEN c.id ELSE first_value(c.id) OVER (
            PARTITION BY c.name, c.unique_key ORDER BY c.finished_at DESC NULLS LAST, c.id
        ) END AS first
    FROM candidate c
), in_place AS (
    UPDATE ONLY axa_queue q SET {_SET}
    FROM ranked r
    WHERE q.id = r.id AND r.live IS NULL AND r.first = r.id AND r.home = 'axa_queue'::regclass
    RETURNING q.id
), gone AS (
    DELETE FROM axa_queue q USING ranked r
    WHERE q.id = r.id AND r.live IS NULL AND r.first = r.id AND r.home <> 'axa_queue'::regclass
    RETURNING q.*
), moved AS (
    INSERT INTO axa_queue ({HISTORY_COLUMNS})
    SELECT {_MOVED} FROM gone g
    RETURNING id
), retried AS (
    SELECT id FROM in_place UNION ALL SELECT id FROM moved
)
SELECT id, true, NULL::uuid FROM retried
UNION ALL
SELECT id, false, coalesce(live, first) FROM ranked WHERE live IS NOT NULL OR first <> id
"""
