"""The claims: the plain claim, its lanes' walk, the look for the next due row, and ``compose``.

Templates hold ``{names}``, ``{backends}`` and ``{queues}`` slots that the worker fills
once with literals (``compose``); ``%(...)s`` are parameters bound per execution.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import psycopg.sql

# Claim up to %(limit)s ready jobs, per name best first, in one statement. The LATERAL
# walk per name (per name and queue for a --queue worker) keeps the cost flat however
# many rows other names or queues hold. The rows are gathered in ARRAY(...), an InitPlan
# run once, so no join order can re-run the locking subquery and claim past the LIMIT.
# django.tasks rows (backend set) are walked per backend alias instead, any task path:
# the worker resolves their task and refuses anything that is not one (taskrunner.py).
# attempts stops short of int overflow so that no row can make the claim fail, and a
# run_at before year 1 in UTC ('-infinity', a date BC) becomes the claim's time, which
# Python (and the admin) can load: loading such a time failed the claim after it had
# committed, and left every row it took running under a worker that never ran them.
# started_at is set at once unless %(ahead)s (rows claimed ahead of free threads): then
# it is written when a thread has started the job (MARK_STARTED, FINISH), and a row a
# dead worker held without starting is queued again without losing an attempt. A row
# with history (an error, a rescue) is marked at once, so that a job that kills its
# worker counts a loss from its second try on and cannot loop for ever.
# Every claim finds its rows where its walk locked them (their ctids, a TID scan):
# locked, they stay there until the UPDATE, and no statistics can give the planner a
# worse way (1.3 us less of the server's time per row than by id: pg15-claim-tid-ab.txt).
# By id with a status test, a generic plan made while the statistics said nothing was
# queued walked the whole ready index for the ids. A row updated and committed after
# the statement's snapshot was taken is locked in its new version, which that snapshot
# cannot see: it is left queued for the next claim.
# RETURNING comes in no particular order: the worker sorts by priority and run_at.
# What a claim writes and returns, shared with the limited claim (sqlflow.py).
RUN_AT = "CASE WHEN q.run_at < '0001-01-01 00:00:00+00' THEN now() ELSE q.run_at END"
CLAIMED = f"""
SET status = 'running', updated_at = now(),
    started_at = CASE WHEN NOT %(ahead)s OR q.errors <> '[]'::jsonb THEN now() END,
    attempts = LEAST(q.attempts, 2147483646) + 1, worker_id = %(worker)s, cancel_requested = false,
    run_at = {RUN_AT}"""
# The setting and the claim's time are the same for every row: the one is set once (an
# InitPlan) for the statement's own transaction, the other read as seconds, which the
# worker loads at about a tenth of the cost of a timestamptz (it turns them into a time
# only for jobs with a timeout). Shared with the rated claim (flow.py) and FINISH.
#
# Off only where nothing waits for a standby: a crash then loses at most the last fraction
# of a second of claims and outcomes, which the worker reconciles (a job run again, never
# one lost: the watchman's RECONCILE). Under synchronous replication
# (synchronous_standby_names set) the session's own setting stands, so an outcome the
# worker acted on survives a failover to the standby.
FLUSH = (
    "CASE WHEN current_setting('synchronous_standby_names') = '' THEN 'off' "
    "ELSE current_setting('synchronous_commit') END"
)
NO_FLUSH = f"(SELECT set_config('synchronous_commit', {FLUSH}, true))"
CLAIM_TIME = "extract(epoch FROM now())::float8"
# run_at as a UTC time without a zone: the worker only orders rows by it and keeps the
# newest per lane (worker/lanes.py), and loads it at a fifth of a timestamptz's cost.
CLAIM_RUN_AT = "(q.run_at AT TIME ZONE 'UTC')"
CLAIM_RETURNING = f"""
RETURNING q.id, q.name, q.args::text, q.attempts, q.max_attempts, q.backend, q.started_at IS NULL,
    q.priority, {CLAIM_RUN_AT}, {NO_FLUSH}, q.timeout, {CLAIM_TIME}
"""
CLAIM = f"""
UPDATE ONLY axa_queue q{CLAIMED}
WHERE q.ctid = ANY(ARRAY(
    SELECT c.ctid FROM ({{walks}}) AS c
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
SELECT NULL::uuid, NULL, NULL, NULL::int, NULL::int, NULL, NULL::bool, NULL::int, NULL::timestamp, NULL,
    NULL::float8, NULL::float8, snap.xmin, snap.xmax, snap.at FROM snap
"""
CLAIM_FULL = _SNAPPED.replace("{claim}", CLAIM)
CLAIM_LANES = _SNAPPED.replace("{claim}", CLAIM.replace("{walks}", "{lane_walks}"))
# "status BETWEEN 'queued' AND 'queued'" is how the claims say queued: only the claim
# indexes are built for it (models.py), so no plan can take the seed's ready index.
_NAME_WALK = """
    SELECT c.ctid, c.priority, c.run_at FROM unnest({names}::text[]) AS n(name)
    CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = n.name AND backend IS NULL AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""
_BACKEND_WALK = """
    SELECT t.ctid, t.priority, t.run_at FROM unnest({backends}::text[]) AS b(backend)
    CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
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
    SELECT c.ctid, c.priority, c.run_at
    FROM unnest({lane_names}::text[], {lane_priorities}::int[], %(floors)s::timestamptz[]) AS l(name, priority, floor)
    CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = l.name AND priority = l.priority AND backend IS NULL
          AND run_at >= l.floor AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""
_GAP_WALK = """
    SELECT c.ctid, c.priority, c.run_at
    FROM unnest({gap_names}::text[], {gap_above}::int8[], {gap_below}::int8[]) AS g(name, above, below)
    CROSS JOIN LATERAL (
        SELECT ctid, priority, run_at FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = g.name AND priority > g.above AND priority < g.below
          AND backend IS NULL AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c"""

# The look behind the floors (worker/lookout.py): the oldest ready row of any known lane
# below its floor, under the claim's own filters, or NULL. It reads what the lanes' walk
# never does (the dead entries a held snapshot keeps below the floors), so it runs on
# another connection than the claims, which keep walking from their floors meanwhile.
# No FOR UPDATE: a row another worker is claiming right now only lowers a floor in vain.
_LOOK_WALK = """
    SELECT c.run_at
    FROM unnest({lane_names}::text[], {lane_priorities}::int[], %(floors)s::timestamptz[]) AS l(name, priority, floor)
    CROSS JOIN LATERAL (
        SELECT run_at FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND name = l.name AND priority = l.priority AND backend IS NULL
          AND run_at < l.floor AND run_at <= now() {queue}
        ORDER BY priority DESC, run_at
        LIMIT 1
    ) AS c"""
LOOK_BEHIND = "SELECT min(run_at) FROM ({look_walks}) AS behind"

# Seconds until the earliest future job this worker could run, or NULL; capped at a
# day so that a row with run_at = 'infinity' cannot make an infinite wait.
NEXT_RUN = """
SELECT extract(epoch FROM LEAST(min(run_at), now() + interval '1 day') - now())::float8 FROM ONLY axa_queue
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
    if "{look_walks}" in text:
        lanes = list(lanes)
        values.update(lane_names=[n for n, _ in lanes], lane_priorities=[p for _, p in lanes])
        text = text.replace("{look_walks}", "\n    UNION ALL".join(_LOOK_WALK.replace("{queue}", f) for f in filters))
    text = text.replace("{queue_filter}", "AND queue = ANY({queues}::text[])" if queues else "")
    text = text.replace("{paused}", PAUSED_ANY)

    def literal(match: re.Match[str]) -> str:
        return psycopg.sql.Literal(values[match.group(1)]).as_string(None).replace("%", "%%")

    return _SLOT.sub(literal, text)


# Statements that find rows by id say "running" as status || '' = 'running' and compare
# worker_id with IS NOT DISTINCT FROM: no index can take either, so the rows are found
# by primary key alone. Through axa_queue_running or axa_queue_status, a plan would read
# the entry of every row that was ever running, which a held snapshot keeps (worker/lanes.py).
