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

# Claim up to %(limit)s ready jobs, best first (priority, then run_at), in one statement.
# One walk in that order over every name and backend alias this worker serves (the
# {serves} filter; a --queue worker: one walk per queue), which locks only the rows it
# takes: it walks the priorities as segments, highest first, and stops at the LIMIT.
# Walked per name instead (each name's walk locking up to the LIMIT before the best were
# kept), a claim of 64 rows over 1,000 names locked 63,968 rows and read 195,000 buffers:
# benchmarks/results/pg15-claim-spread.txt. The rows are gathered in ARRAY(...), an
# InitPlan run once, so no join order can re-run the locking subquery and claim past the
# LIMIT. django.tasks rows (backend set) are served by their backend alias, any task
# path: the worker resolves their task and refuses anything that is not one (taskrunner.py).
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
# queued walked the whole ready index for the ids. A row written after the statement's
# snapshot was taken is passed over by the walk (UNTOUCHED); one locked in a newer
# version anyway (its writer's id beyond UNTOUCHED's bounds) is not updated, as the
# snapshot cannot see that version: it is left queued for the next claim.
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
    SELECT c.ctid FROM ({{walks}}) AS c{{order}}
    LIMIT %(limit)s
)){CLAIM_RETURNING}"""
# Both claims of background jobs report their snapshot (worker/lanes.py): its oldest
# running transaction id, an id above every id given before the claim began, and its
# time, on a row of their own (id NULL) after the claimed rows, so that an empty claim
# reports it too. The snapshot's xmax is not such an id ("one past the highest
# completed"): a transaction that got its id before the claim and was the newest running
# one was at or above it, and the floors went past the rows it then committed (100,000
# rows of a bulk INSERT waited 8 s for the look). age() reads one id, fixed at its first
# use in the claim's transaction: the next id to be given then (UNTOUCHED's test of the
# walk's first row, before the claim takes its own), or the claim's own; it takes none
# (an id for every empty claim cost a commit record and an id a poll: ten times the ids
# an idle fleet used); it counts in 32 bits, placed here above the snapshot's xmax, less
# than 2^32 below it.
# (%% is psycopg's %: the claims are run with parameters.)
NEXT_ID = """(SELECT x + (((n - x %% 4294967296) %% 4294967296) + 4294967296) %% 4294967296
    FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS x,
        ((age('3'::xid)::int8 + 3) %% 4294967296 + 4294967296) %% 4294967296 AS n) AS ids)"""
_SNAPPED = f"""
WITH claimed AS ({{claim}}), snap AS MATERIALIZED (
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8 AS xmin, {NEXT_ID} AS xmax, now() AS at
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
# What this worker claims: its job names' rows, and django.tasks rows of its backend
# aliases. IS TRUE keeps the test out of every index: on names and aliases the planner
# would take the per-name indexes and sort every ready row instead of walking in order.
SERVES = "((backend IS NULL AND name = ANY({names}::text[])) OR backend = ANY({backends}::text[])) IS TRUE"

# The walk passes over a row whose queued version another transaction wrote (claimed,
# finished, locked) after the claim's snapshot, before locking it: that version's xmax is
# an id the snapshot cannot see as ended, running when the snapshot was taken (its xip)
# or given between the snapshot and the walk's first row. Locked, as READ COMMITTED locks
# such a row (its newest version, then its recheck fails), the row stayed locked by the
# claim to its end, and the other worker's finish of it waited for the claim (a fleet of
# 16 to 32 processes: several finishes waiting at any moment, "finisher <- claim" on
# Lock:transactionid: benchmarks/results/pg15-claim-untouched-ab.txt). Ids are compared as
# age(): 32-bit distances from the one id age() fixes for the claim's transaction (the
# next id to be given when the walk began, or the transaction's own), so wraparound
# cannot confuse them. The bounds are what keep every row claimable: an xmax of 0, the
# transaction's own id (its own earlier writes, as run_jobs() makes them) and ids given
# during the walk are never passed over. An xmax can be a MultiXact id (two transactions
# sharing a row lock, as two foreign-key inserts that refer to one job do), which SQL
# cannot tell from a transaction id: read as one, it could fall in the ids given since the
# snapshot, but on a server where nothing writes that span is empty, so no MultiXact can
# hold a row while the queue waits for ids (review: a window of 65,535 ids held such a
# row through every claim of an idle queue). A row passed over stays queued: the next
# claim takes it, and one the floors passed meanwhile is found by the look. Not passed
# over, and locked as before: a row written by a subtransaction (a savepoint) of a
# transaction running at the snapshot, whose id the snapshot's xip does not list.
UNTOUCHED = """NOT (age(xmax)::int8 BETWEEN 1 AND (SELECT age(xid(pg_snapshot_xmax(pg_current_snapshot()))))::int8
      OR xmax = ANY(ARRAY(SELECT xid(x) FROM pg_snapshot_xip(pg_current_snapshot()) x)))"""

# The walk, segment by segment in the order of the unnest (priorities highest first), each
# segment's rows oldest first (axa_queue_claim_all), each from its floor (worker/lanes.py):
# rows whose claims left dead index entries behind a floor are never walked, however old
# the oldest snapshot is, and ready rows of names this worker does not serve are read once
# as the walk passes them, not at every claim. A lane is one priority: its floor and now()
# bound run_at both ways under priority's equality, so the walk starts at its floor and
# never reaches the rows due later in that priority. A gap is the priorities between lanes
# (or all of them), so a priority not seen yet is found at once; its floor is tested on the
# index entries, before any row is read. A segment fills only one of the two branches (the
# other's keys are NULL, which no index entry matches). No ORDER BY above the walk: a
# Nested Loop hands on rows as the segments yield them, in order, and the LIMIT stops the
# walk (and its locking) at the rows taken. Each branch has the claim's LIMIT too, for the
# planner: it cannot see a segment's bounds and guesses a few hundred rows in each, and a
# LIMIT above that (the most a worker ever asks for, 2,052 at the defaults) planned each
# segment as a Bitmap Heap Scan and a Sort of all its ready rows (40,000 rows, 50 ms a
# claim). %(floors)s has one floor per segment ('-infinity': from its start).
_SEGMENT_WALK = """
    SELECT c.ctid, c.priority, c.run_at
    FROM unnest({seg_exact}::int[], {seg_above}::int8[], {seg_below}::int8[], {floors}::timestamptz[])
        AS s(exact, above, below, floor)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT ctid, priority, run_at FROM ONLY axa_queue
            WHERE status BETWEEN 'queued' AND 'queued' AND priority = s.exact AND run_at >= s.floor
              AND run_at <= now() AND {serves} {queue} AND {untouched}
            ORDER BY priority DESC, run_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS lane
        UNION ALL
        SELECT * FROM (
            SELECT ctid, priority, run_at FROM ONLY axa_queue
            WHERE status BETWEEN 'queued' AND 'queued' AND priority > s.above AND priority < s.below
              AND run_at >= s.floor AND run_at <= now() AND {serves} {queue} AND {untouched}
            ORDER BY priority DESC, run_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS gap
    ) AS c""".replace("{untouched}", UNTOUCHED)

# The look behind the floors (worker/lookout.py): the oldest ready row of any segment
# below its floor, under the claim's own filters, or NULL. It reads what the walk never
# does (the dead entries a held snapshot keeps below the floors, the rows of other names
# the claims passed), so it runs on another connection than the claims, which keep
# walking from their floors meanwhile. No FOR UPDATE: a row another worker is claiming
# right now only lowers a floor in vain. A gap's oldest row is its rows' min(): the first
# row of its best priority behind the floor let older rows of its other priorities wait a
# look each, and one of them held locked hid them all (review). As seconds since the
# epoch: '-infinity' or a time before year 1, which Python cannot load, failed every look.
_LOOK_WALK = """
    SELECT c.run_at
    FROM unnest({seg_exact}::int[], {seg_above}::int8[], {seg_below}::int8[], %(floors)s::timestamptz[])
        AS s(exact, above, below, floor)
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT run_at FROM ONLY axa_queue
            WHERE status BETWEEN 'queued' AND 'queued' AND priority = s.exact AND run_at < s.floor
              AND run_at <= now() AND {serves} {queue}
            ORDER BY priority DESC, run_at
            LIMIT 1
        ) AS lane
        UNION ALL
        SELECT min(run_at) FROM ONLY axa_queue
        WHERE status BETWEEN 'queued' AND 'queued' AND priority > s.above AND priority < s.below
          AND run_at < s.floor AND run_at <= now() AND {serves} {queue}
    ) AS c"""
LOOK_BEHIND = "SELECT extract(epoch FROM min(run_at))::float8 FROM ({look_walks}) AS behind"

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

_SLOT = re.compile(r"\{(names|backends|queue_\d+|queues|limited|seg_\w+)\}")
_NO_PRIORITY_ABOVE, _NO_PRIORITY_BELOW = -(2**31) - 1, 2**31


def segments(lanes: Sequence[int]) -> list[tuple[int | None, int | None, int | None]]:
    """The walk's segments for the known lanes' priorities, highest first: (priority, None, None)
    for a lane, (None, above, below) for the open range of priorities between two lanes."""
    bounds = [_NO_PRIORITY_BELOW, *sorted(set(lanes), reverse=True), _NO_PRIORITY_ABOVE]
    found: list[tuple[int | None, int | None, int | None]] = []
    for below, above in itertools.pairwise(bounds):
        if below != _NO_PRIORITY_BELOW:
            found.append((below, None, None))
        if below - above > 1:
            found.append((None, above, below))
    return found


def _segment_values(found: list[tuple[int | None, int | None, int | None]]) -> dict[str, list[int | None]]:
    return {
        "seg_exact": [exact for exact, _, _ in found],
        "seg_above": [above for _, above, _ in found],
        "seg_below": [below for _, _, below in found],
    }


def _filled(template: str, filters: list[str]) -> list[str]:
    """``template`` under each queue filter."""
    return [template.replace("{queue}", f).replace("{serves}", SERVES) for f in filters]


def _walks(template: str, filters: list[str]) -> tuple[str, str]:
    """The walks of ``template`` under each queue filter, and the ORDER BY that merges several."""
    walks = _filled(template, filters)
    if len(walks) == 1:
        return walks[0], ""  # in order on its own
    # Several (a worker of some queues) are sorted together: each stops at the LIMIT on its own,
    # or the Sort would pull (and lock) every row of every segment up to the LIMIT.
    legs = [f"SELECT * FROM ({walk}\n    LIMIT %(limit)s) AS w{index}" for index, walk in enumerate(walks)]
    return "\n    UNION ALL\n    ".join(legs), "\n    ORDER BY c.priority DESC, c.run_at"


def compose(
    template: str,
    names: list[str],
    backends: list[str],
    queues: list[str] | None,
    limited: list[str] | None = None,
    lanes: Sequence[int] = (),
) -> str:
    """``template`` with the worker's fixed names, backends and queues written in as literals.

    A --queue worker walks each of its queues apart, its name written in, so that the
    planner sees how few rows that queue holds and takes the per-queue index. ``lanes``:
    the priorities the lane walk and the look take floors for (worker/lanes.py). One pass
    over the text: a value is never scanned again, so a name such as ``%(queues)s`` or
    ``{names}`` stays data. ``%`` is doubled so that psycopg leaves it alone while binding
    the statement's own parameters.
    """
    values: dict[str, Any] = {"names": names, "backends": backends, "queues": queues or [], "limited": limited or []}
    filters = [HELD_ANY]
    if queues:
        filters = [HELD_ONE.format(slot=f"{{queue_{index}}}") for index in range(len(queues))]
        values.update({f"queue_{index}": queue for index, queue in enumerate(queues)})
    for slot, floors, seg_lanes in (("{walks}", None, ()), ("{lane_walks}", "%(floors)s", lanes)):
        if slot in template:
            found = segments(seg_lanes)
            walk = _SEGMENT_WALK.replace("{floors}", floors or "{seg_floors}")
            values.update(_segment_values(found), seg_floors=["-infinity"] * len(found))
            walks, order = _walks(walk, filters)
            template = template.replace(slot, walks).replace("{order}", order)
    text = template
    if "{look_walks}" in text:
        values.update(_segment_values(segments(lanes)))
        text = text.replace("{look_walks}", "\n    UNION ALL".join(_filled(_LOOK_WALK, filters)))
    text = text.replace("{queue_filter}", "AND queue = ANY({queues}::text[])" if queues else "")
    text = text.replace("{paused}", PAUSED_ANY)

    def literal(match: re.Match[str]) -> str:
        return psycopg.sql.Literal(values[match.group(1)]).as_string(None).replace("%", "%%")

    return _SLOT.sub(literal, text)


# Statements that find rows by id say "running" as status || '' = 'running' and compare
# worker_id with IS NOT DISTINCT FROM: no index can take either, so the rows are found
# by primary key alone. Through axa_queue_running or axa_queue_status, a plan would read
# the entry of every row that was ever running, which a held snapshot keeps (worker/lanes.py).


# The fleet's poller, every POLL_INTERVAL (on its listener's connection, busy or idle): did
# queued rows fall due since its last look (``since``; the first looks back ``window`` s)? Then
# every worker is woken, as an enqueue wakes them: rows made claimable without a word (a retry's
# backoff ending, rows written with triggers off, a slot freed by the seed's FINISH) are claimed
# within POLL_INTERVAL though the others poll less often. A paused queue's rows wake nobody. An
# index range on run_at from ``since``: never the entries a held snapshot keeps before it.
FLEET_PROBE = """
SELECT now(), (
    SELECT pg_notify('axa_queue', '') FROM ONLY axa_queue q
    WHERE q.status = 'queued' AND q.run_at <= now()
      AND q.run_at > COALESCE(%(since)s::timestamptz, now() - %(window)s * interval '1 second')
      AND NOT EXISTS (SELECT 1 FROM axa_paused_queue p WHERE p.queue = q.queue)
    LIMIT 1
)
"""
