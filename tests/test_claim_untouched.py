"""The claim passes over a row another transaction wrote after its snapshot, and never locks it (issue 46).

Under READ COMMITTED, ``FOR UPDATE SKIP LOCKED`` meeting a row that another worker claimed
and committed after the claim's snapshot locks the row's newest version, then drops it
(its recheck fails) but keeps the lock to the end of the claim: that worker's finish of
the row waited for the claim. The walk now tests the version it sees (sql.UNTOUCHED):
written by a transaction its snapshot cannot see as ended, the row is passed over before
any lock. A REPEATABLE READ transaction holds the claim's snapshot here while the other
worker moves; there the old walk's lock of a newer version is an error ("could not
serialize access"), so each test below fails on the walk before this one.

Rows whose xmax only locked them and changed nothing (a foreign key's check, two of them
at once: a MultiXact, a rolled-back update) are claimed as before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from axa_django import sql
from axa_django.execution import Claimed, finish
from axa_django.sql import claims
from axa_django.worker import connect
from tests import clusters
from tests.conftest import AXA_APPS, ROOT
from tests.races import completed
from tests.test_claim_walk import insert, locked

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

NAMES = ["a"]


def claim(conn: psycopg.Connection[Any], worker: uuid.UUID, limit: int) -> list[Claimed]:
    """The worker's plain claim (sql.CLAIM) of up to ``limit`` rows, best first."""
    statement = sql.compose(sql.CLAIM, NAMES, [], None)
    rows = conn.execute(statement, {"worker": worker, "limit": limit, "ahead": False}).fetchall()
    rows.sort(key=lambda row: row[8])
    return [Claimed(r[0], r[1], None, r[3], r[4], backend=r[5], args_json=r[2], unmarked=r[6]) for r in rows]


@pytest.fixture
def conns() -> Iterator[tuple[psycopg.Connection[Any], psycopg.Connection[Any], psycopg.Connection[Any]]]:
    """The old snapshot's connection, the other worker's and a third; a row lock waited on fails at once."""
    with connect("default", "held") as held, connect("default", "other") as other, connect("default", "third") as third:
        for conn in (held, other, third):
            conn.autocommit = True
            conn.execute("SET lock_timeout = '2s'")
            conn.execute("SET idle_in_transaction_session_timeout = 0")
        yield held, other, third


def snapshot(conn: psycopg.Connection[Any]) -> None:
    """Open a REPEATABLE READ transaction on ``conn`` and take its snapshot now."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT 1")


def ids(claimed: list[Claimed]) -> list[uuid.UUID]:
    return [c.id for c in claimed]


def test_a_row_claimed_and_committed_after_the_snapshot_is_passed_over_and_its_finish_waits_for_nothing(
    conns: tuple[psycopg.Connection[Any], ...],
) -> None:
    held, other, _ = conns
    rows = [insert(held, "a", 0, f"{10 - i} minutes") for i in range(3)]
    snapshot(held)
    worker = uuid.uuid4()
    (taken,) = claim(other, worker, 1)  # committed after held's snapshot
    assert taken.id == rows[0]
    # Before: "could not serialize access due to concurrent update" (the lock of the newer version).
    assert ids(claim(held, uuid.uuid4(), 10)) == rows[1:]
    # The claim's transaction is still open: the other worker's finish does not wait for it.
    assert finish(other.cursor(), [completed(taken)], worker) == set()
    held.execute("COMMIT")
    (status,) = other.execute("SELECT status FROM axa_queue WHERE id = %s", [rows[0]]).fetchone()
    assert status == "completed"


def test_a_row_claimed_by_a_transaction_running_at_the_snapshot_is_passed_over_once_it_commits(
    conns: tuple[psycopg.Connection[Any], ...],
) -> None:
    held, other, _ = conns
    rows = [insert(held, "a", 0, f"{10 - i} minutes") for i in range(3)]
    worker = uuid.uuid4()
    other.execute("BEGIN")
    (taken,) = claim(other, worker, 1)
    snapshot(held)  # other's transaction is running: its id is in held's snapshot
    other.execute("COMMIT")
    assert ids(claim(held, uuid.uuid4(), 10)) == rows[1:]
    assert finish(other.cursor(), [completed(taken)], worker) == set()
    held.execute("COMMIT")


def test_rows_locked_by_transactions_that_changed_nothing_are_claimed(
    conns: tuple[psycopg.Connection[Any], ...],
) -> None:
    held, other, third = conns
    share = "SELECT 1 FROM axa_queue WHERE id = %s FOR KEY SHARE"  # what a foreign key's check runs
    fk_checked, two_checks, rolled_back, untouched = (insert(held, "a", 0, f"{10 - i} minutes") for i in range(4))
    with other.transaction():
        other.execute(share, [fk_checked])
    # Two transactions holding the lock at once leave a MultiXact id as the row's xmax.
    other.execute("BEGIN")
    third.execute("BEGIN")
    other.execute(share, [two_checks])
    third.execute(share, [two_checks])
    other.execute("COMMIT")
    third.execute("COMMIT")
    (members,) = held.execute(
        "SELECT count(*) FROM axa_queue q, pg_get_multixact_members(q.xmax) WHERE q.id = %s", [two_checks]
    ).fetchone()
    assert members == 2
    other.execute("BEGIN")
    other.execute("UPDATE axa_queue SET priority = 5 WHERE id = %s", [rolled_back])
    other.execute("ROLLBACK")
    (written,) = held.execute(
        "SELECT count(*) FROM axa_queue WHERE xmax <> '0'::xid AND id = ANY(%s)",
        [[fk_checked, two_checks, rolled_back, untouched]],
    ).fetchone()
    assert written == 3
    assert ids(claim(held, uuid.uuid4(), 10)) == [fk_checked, two_checks, rolled_back, untouched]


def test_a_row_locked_after_the_snapshot_and_unchanged_is_passed_over_once_then_claimed(
    conns: tuple[psycopg.Connection[Any], ...],
) -> None:
    held, other, _ = conns
    first, second = (insert(held, "a", 0, f"{10 - i} minutes") for i in range(2))
    snapshot(held)
    with other.transaction():
        other.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR KEY SHARE", [first])
    assert ids(claim(held, uuid.uuid4(), 10)) == [second]
    held.execute("COMMIT")
    # The next claim's snapshot sees the lock's transaction ended: the row is taken.
    assert ids(claim(held, uuid.uuid4(), 10)) == [first]


def test_rows_the_claims_own_transaction_wrote_or_locked_are_claimed(
    conns: tuple[psycopg.Connection[Any], ...],
) -> None:
    # As run_jobs() claims in a test's transaction, after its own finish and retry wrote the
    # rows: the transaction's own id (and a savepoint's) is never one to pass over.
    held, _, _ = conns
    with held.transaction(force_rollback=True):
        locked, updated, in_savepoint = (insert(held, "a", 0, f"{10 - i} minutes") for i in range(3))
        held.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", [locked])
        held.execute("UPDATE axa_queue SET args = '{\"x\": 1}' WHERE id = %s", [updated])
        with held.transaction():
            held.execute("UPDATE axa_queue SET args = '{\"x\": 2}' WHERE id = %s", [in_savepoint])
        assert ids(claim(held, uuid.uuid4(), 10)) == [locked, updated, in_savepoint]


@pytest.mark.skipif(clusters.unavailable() is not None, reason=str(clusters.unavailable()))
def test_a_multixact_xmax_just_above_the_next_transaction_id_never_holds_a_job_on_an_idle_server() -> None:
    # Review: two foreign-key checks at once leave a MultiXact id as the row's xmax, which SQL
    # cannot tell from a transaction id. A long-lived cluster's next MultiXact id passes just
    # above its next transaction id once a lap of the 32-bit counter (pg_resetwal -m makes it
    # so at once): with 65,535 ids after the snapshot's xmax passed over, every claim of an
    # idle queue (taking no id) passed the job over, and the look lowered the floor to it in vain.
    root = clusters.workspace()
    cluster = clusters.Cluster(root, "multixact").init()
    try:
        cluster._run("pg_resetwal", "-m", "8192,1", "-D", str(cluster.data))
        cluster.start()
        with cluster.connect("postgres") as conn:
            conn.execute("CREATE DATABASE axa_ha")
        env = dict(os.environ, DATABASE_URL=cluster.url(), DJANGO_SETTINGS_MODULE="tests.settings")
        migrate = [sys.executable, "-m", "django", "migrate", "-v", "0"]
        done = subprocess.run(migrate, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        with cluster.connect() as held, cluster.connect() as other, cluster.connect() as third:
            job = insert(held, "a", 0, "1 minute")
            share = "SELECT 1 FROM axa_queue WHERE id = %s FOR KEY SHARE"
            for conn in (other, third):
                conn.execute("BEGIN")
                conn.execute(share, [job])
            for conn in (other, third):
                conn.execute("COMMIT")
            (multi, next_id) = held.execute(
                "SELECT xmax::text::int8, pg_snapshot_xmax(pg_current_snapshot())::text::int8 FROM axa_queue"
            ).fetchone()
            (members,) = held.execute(
                "SELECT count(*) FROM pg_get_multixact_members(%s::text::xid)", [multi]
            ).fetchone()
            assert members == 2 and 0 < multi - next_id < 65535, (multi, next_id)
            assert ids(claim(held, uuid.uuid4(), 10)) == [job]
    finally:
        clusters.remove(root, [cluster])


def every_segment(lanes: list[int]) -> str:
    """The floors that walk every segment of the lanes' claim from its start."""
    return "{" + ",".join(["-infinity"] * len(sql.segments(lanes))) + "}"


@pytest.mark.parametrize("lock", ["FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE"])
def test_a_row_locked_and_released_before_the_claim_is_claimed(
    conns: tuple[psycopg.Connection[Any], ...], lock: str
) -> None:
    # User code's select_for_update(), a share lock, a foreign key's check, committed.
    held, other, _ = conns
    row = insert(held, "a", 0, "1 minute")
    with other.transaction():
        other.execute(f"SELECT 1 FROM axa_queue WHERE id = %s {lock}", [row])
    assert ids(claim(held, uuid.uuid4(), 10)) == [row]


def test_a_job_that_two_foreign_key_rows_took_at_once_is_claimed(conns: tuple[psycopg.Connection[Any], ...]) -> None:
    held, other, third = conns
    held.execute("CREATE TABLE untouched_child (id serial PRIMARY KEY, job uuid NOT NULL REFERENCES axa_queue(id))")
    try:
        row = insert(held, "a", 0, "1 minute")
        for conn in (other, third):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO untouched_child (job) VALUES (%s)", [row])
        for conn in (other, third):
            conn.execute("COMMIT")
        (members,) = held.execute(
            "SELECT count(*) FROM axa_queue q, pg_get_multixact_members(q.xmax) WHERE q.id = %s", [row]
        ).fetchone()
        assert members == 2
        assert ids(claim(held, uuid.uuid4(), 10)) == [row]
    finally:
        held.execute("DROP TABLE untouched_child")


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_claims_run_under_any_default_isolation_with_generic_plans(
    conns: tuple[psycopg.Connection[Any], ...], isolation: str
) -> None:
    # default_transaction_isolation set on a role or database; the worker plans generically.
    held, other, _ = conns
    rows = [insert(held, "a", 0, f"{100 - i} minutes") for i in range(30)]
    for conn in (held, other):
        conn.execute(f"SET default_transaction_isolation = '{isolation}'")
        conn.execute("SET plan_cache_mode = force_generic_plan")
    statement = sql.compose(sql.CLAIM_LANES, NAMES, [], None, lanes=[0])
    got: list[uuid.UUID] = []
    for turn in range(15):  # prepared, past the executions before a generic plan
        params = {"worker": uuid.uuid4(), "limit": 2, "ahead": False, "floors": every_segment([0])}
        out = (held if turn % 2 else other).execute(statement, params, prepare=True).fetchall()
        got += [row[0] for row in out if row[0] is not None]
        (snap,) = [row for row in out if row[0] is None]
        assert snap[13] >= snap[12]
    assert sorted(got) == sorted(rows)


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_the_claims_reported_ids_still_bound_every_id_given_before_it(
    conns: tuple[psycopg.Connection[Any], ...], rows: int
) -> None:
    # The floors (worker/lanes.py) need an id above every id given before the claim began;
    # age() now fixes its id at the walk's first row, before the claim takes its own.
    held, other, third = conns
    for i in range(rows):
        insert(held, "a", 0, f"{10 - i} minutes")
    other.execute("BEGIN")
    (running,) = other.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
    (given,) = third.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
    statement = sql.compose(sql.CLAIM_LANES, NAMES, [], None, lanes=[0])
    held.execute("BEGIN")
    params = {"worker": uuid.uuid4(), "limit": 3, "ahead": False, "floors": every_segment([0])}
    out = held.execute(statement, params).fetchall()
    (own,) = held.execute("SELECT pg_current_xact_id_if_assigned()::text::int8").fetchone()
    held.execute("COMMIT")
    other.execute("COMMIT")
    (snap,) = [row for row in out if row[0] is None]
    xmin, xmax = snap[12], snap[13]
    assert xmin <= running < xmax and given < xmax
    assert (own is None) == (rows == 0)
    assert own is None or xmax <= own


def test_the_test_adds_no_scan_to_the_claims_plan(
    conns: tuple[psycopg.Connection[Any], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    held, _, _ = conns
    held.execute(
        "INSERT INTO axa_queue (id, name, args, priority, run_at) "
        "SELECT gen_random_uuid(), 'a', '{}', g % 3, now() - g * interval '1 ms' FROM generate_series(1, 100000) g"
    )
    held.execute("ANALYZE axa_queue")
    held.execute("SET plan_cache_mode = force_generic_plan")
    plans = {}
    walk = claims._SEGMENT_WALK
    for label, untouched in (("with", claims.UNTOUCHED), ("without", "true")):
        monkeypatch.setattr(claims, "_SEGMENT_WALK", walk.replace(claims.UNTOUCHED, untouched))
        statement = sql.compose(sql.CLAIM_LANES, NAMES, [], None, lanes=[0, 1, 2])
        params = {"worker": uuid.uuid4(), "limit": 64, "ahead": False, "floors": every_segment([0, 1, 2])}
        with held.transaction(force_rollback=True):
            (plan,) = held.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()
        plans[label] = plan[0]["Plan"]

    def shape(node: dict[str, Any]) -> list[str]:
        """The nodes that read axa_queue or order, join or lock its rows (the test adds InitPlans only)."""
        kinds = ("LockRows", "Sort", "Nested Loop", "Limit")
        own = [f"{node['Node Type']}:{node.get('Index Name', '')}"]
        mine = node.get("Relation Name") == "axa_queue" or node["Node Type"] in kinds
        return (own if mine else []) + [kind for child in node.get("Plans", []) for kind in shape(child)]

    assert shape(plans["with"]) == shape(plans["without"]), json.dumps(plans)[:3000]
    assert locked(plans["with"]) == locked(plans["without"]) == 64
