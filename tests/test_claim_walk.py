"""The plain claim's one walk over every name (issue 46): it locks only the rows it takes.

Each name used to be walked apart, every walk locking up to the claim's LIMIT before the
best were kept: a claim of 64 rows over 1,000 names locked 63,968. Here: what the walk
locks, in which order it takes rows across names, priorities and backends, and what it
does beside another claim holding rows (two connections, the first one's transaction
held open while the second claims).
"""

from __future__ import annotations

import datetime
import json
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from axa_django import sql
from axa_django.worker import connect, lanes
from axa_django.worker.lookout import Lookout
from tests.conftest import AXA_APPS, wait_for
from tests.test_scale_claim import NAME, Claimer, enqueue

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def insert(conn: psycopg.Connection, name: str, priority: int, age: str, backend: str | None = None) -> uuid.UUID:
    """One ready row of ``name``, ``age`` old (its run_at), written as SQL."""
    (job_id,) = conn.execute(
        "INSERT INTO axa_queue (id, name, args, priority, run_at, backend) "
        "VALUES (gen_random_uuid(), %s, '{}', %s, now() - %s::interval, %s) RETURNING id",
        [name, priority, age, backend],
    ).fetchone()
    return job_id


def claim(conn: psycopg.Connection, names: list[str], limit: int, backends: list[str] | None = None) -> list[Any]:
    """The ids the worker's plain claim (a first claim: every lane from its start) takes, in the order it walked."""
    statement = sql.compose(sql.CLAIM, names, backends or [], None)
    rows = conn.execute(statement, {"worker": uuid.uuid4(), "limit": limit, "ahead": False}).fetchall()
    # RETURNING comes in no order: the worker sorts by priority, then run_at (claimer.py).
    rows.sort(key=lambda row: row[8])
    rows.sort(key=lambda row: row[7], reverse=True)
    return [row[0] for row in rows]


def locked(plan: dict[str, Any]) -> int:
    """Rows the LockRows nodes of an EXPLAIN (FORMAT JSON) plan returned, over all their loops."""
    own = plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1) if plan.get("Node Type") == "LockRows" else 0
    return own + sum(locked(child) for child in plan.get("Plans", []))


@pytest.mark.parametrize("queues", [None, ["default"]])
def test_a_claim_over_a_thousand_names_locks_only_the_rows_it_takes(queues: list[str] | None) -> None:
    names = [f"spread.job{i}" for i in range(1000)]
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        conn.execute(
            "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), 'spread.job' || (g % 1000), '{}' "
            "FROM generate_series(0, 19999) g"
        )
        conn.execute("ANALYZE axa_queue")
        statement = sql.compose(sql.CLAIM_LANES, names, [], queues, lanes=[0])
        floors = "{NULL,-infinity,NULL}"  # the gap above priority 0, its lane, the gap below
        with conn.transaction(force_rollback=True):
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + statement,
                {"worker": uuid.uuid4(), "limit": 64, "ahead": False, "floors": floors},
            ).fetchone()
    # Before: 20 rows of each of the 1,000 names locked (up to the LIMIT each), 64 kept.
    assert locked(plan[0]["Plan"]) == 64, json.dumps(plan)[:3000]


def test_the_walk_takes_the_best_rows_across_names_priorities_and_backends() -> None:
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        rows = {
            "a old": insert(conn, "a", 0, "3 hours"),
            "b older": insert(conn, "b", 0, "4 hours"),
            "a high": insert(conn, "a", 5, "1 minute"),
            "task high": insert(conn, "some.task", 5, "2 minutes", backend="default"),
            "c low": insert(conn, "c", -5, "9 hours"),
            "b new": insert(conn, "b", 0, "1 minute"),
            "not served": insert(conn, "z", 9, "10 hours"),
            "other backend": insert(conn, "some.task", 9, "10 hours", backend="other"),
        }
        order = ["task high", "a high", "b older", "a old", "b new", "c low"]
        assert claim(conn, ["a", "b", "c"], 4, backends=["default"]) == [rows[key] for key in order[:4]]
        assert claim(conn, ["a", "b", "c"], 4, backends=["default"]) == [rows[key] for key in order[4:]]
        (left,) = conn.execute("SELECT count(*) FROM axa_queue WHERE status = 'queued'").fetchone()
        assert left == 2  # the rows of a name and a backend alias this worker does not serve


def test_a_claim_beside_one_holding_the_first_rows_takes_the_next_without_waiting() -> None:
    with connect("default", "holder") as holder, connect("default", "claimer") as other:
        holder.autocommit = other.autocommit = True
        ids = [insert(holder, "a" if i % 2 else "b", 0, f"{20 - i} minutes") for i in range(10)]
        other.execute("SET lock_timeout = '1s'")  # a wait on a row lock would fail it
        with holder.transaction(force_rollback=True):
            assert claim(holder, ["a", "b"], 3) == ids[:3]
            # The holder's transaction is open and holds rows 1-3: the next best are taken.
            with other.transaction(force_rollback=True):
                assert claim(other, ["a", "b"], 4) == ids[3:7]
        # Both rolled back: the first rows are there to take again, best first.
        assert claim(other, ["a", "b"], 10) == ids


def test_a_claim_passes_over_the_rows_of_names_it_does_not_serve_without_locking_them() -> None:
    with connect("default", "a worker") as a_worker, connect("default", "b worker") as b_worker:
        a_worker.autocommit = b_worker.autocommit = True
        theirs = [insert(a_worker, "b", 0, f"{60 - i} minutes") for i in range(5)]  # older than a's
        ours = [insert(a_worker, "a", 0, f"{10 - i} minutes") for i in range(5)]
        b_worker.execute("SET lock_timeout = '1s'")
        with a_worker.transaction(force_rollback=True):
            assert claim(a_worker, ["a"], 10) == ours
            # Locked by the walk that passed them over, b's rows would be skipped here (SKIP LOCKED).
            with b_worker.transaction(force_rollback=True):
                assert claim(b_worker, ["b"], 10) == theirs


def test_a_lane_never_walks_the_rows_due_later_in_its_priority() -> None:
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        conn.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), %s, '{}', "
            "now() + interval '1 day' FROM generate_series(1, 20000)",
            [NAME],
        )
        enqueue(conn, 40)
        conn.execute("ANALYZE axa_queue")
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim(limit=10))
        claimer.wait_bounded()
        assert claimer.statement()[2], "priority 0 walked from its floor"
        # Up to the ready rows and no further: not the 20,000 entries of the rows due tomorrow.
        assert claimer.buffers() < 400
        assert len(claimer.claim(limit=100)) == 30


def past(conn: psycopg.Connection, count: int, name: str = NAME, priority: int = 0) -> list[uuid.UUID]:
    """Ready rows enqueued a second ago: a floor the claims reach is well past them (lanes.MARGIN)."""
    rows = conn.execute(
        "INSERT INTO axa_queue (id, name, args, priority, run_at) "
        "SELECT gen_random_uuid(), %s, '{}', %s, now() - interval '1 second' FROM generate_series(1, %s) RETURNING id",
        [name, priority, count],
    ).fetchall()
    return [row[0] for row in rows]


def drained(conn: psycopg.Connection, count: int = 5) -> Claimer:
    """A claimer that claimed and finished ``count`` ready rows, its floors settled past them."""
    enqueue(conn, count)
    claimer = Claimer(conn, [NAME])
    claimer.finish(claimer.claim(limit=100))  # priority 0 is a lane; 1 to count are a gap
    claimer.settle()
    return claimer


@pytest.mark.parametrize("priority", [0, 10], ids=["same priority", "a priority of their own"])
def test_ready_rows_of_names_this_worker_does_not_serve_are_read_once_not_at_every_claim(priority: int) -> None:
    # A --job worker, or rows of a job name no worker runs any more: the walk passes them,
    # unlocked, and the next claims start past them (review of the one-walk claim: 55-119 ms
    # a claim beside 300,000 such rows).
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        past(conn, 10)
        past(conn, 20000, "other.service.job", priority)  # after this worker's newest row
        conn.execute("ANALYZE axa_queue")
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim(limit=100))
        claimer.settle()
        # An idle poll: none of 100 asked for, every segment walked to its end, the cap known.
        assert claimer.claim(limit=100) == []
        assert claimer.statement()[2], "walked from floors"
        assert claimer.buffers() < 60, "the claim read the other names' rows again"
        enqueue(conn, 3)
        assert len(claimer.claim(limit=100)) == 3


def test_a_row_passed_over_while_locked_is_found_by_the_look_once_released() -> None:
    with (
        connect("default", "test claimer") as conn,
        connect("default", "holder") as holder,
        connect("default", "heartbeat") as beat,
    ):
        conn.autocommit = holder.autocommit = True
        enqueue(conn, 5)
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim(limit=100))
        (locked_id,) = past(conn, 1)
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", [locked_id])  # a user's lock
        assert claimer.claim(limit=100) == []  # passed over: SKIP LOCKED
        holder.execute("ROLLBACK")
        claimer.settle()
        assert claimer.statement()[2] and claimer.claim(limit=100) == []  # behind the floor now
        roused = []
        lookout = Lookout(
            SimpleNamespace(backends=[], queues=None), claimer.lanes, 10.0, rouse=lambda: roused.append(1)
        )
        assert lookout.due()
        lookout.look(beat, "10s")
        assert roused == [1]  # nothing else announces the row: an idle dispatcher is told
        rows = claimer.claim(limit=100)
        assert [row[0] for row in rows] == [locked_id]
        claimer.finish(rows)
        claimer.settle()
        lookout.look(beat, "10s")
        assert roused == [1]  # found nothing: no one is roused


def test_one_look_finds_the_oldest_row_behind_a_gaps_floor_whatever_its_priority() -> None:
    # A gap's look took the first row of its best priority: older rows of its other
    # priorities waited a look (30 s) each, and that row held locked hid them (review).
    with connect("default", "test claimer") as conn, connect("default", "heartbeat") as beat:
        conn.autocommit = True
        claimer = drained(conn)
        assert claimer.claim(limit=100) == []  # an idle poll: the floors swept to the cap
        # Behind every floor, unannounced (this claimer hears no notification): the oldest
        # at priority 1, the newest at priority 5, the gap's best.
        ids = [
            conn.execute(
                "INSERT INTO axa_queue (id, name, args, priority, run_at) VALUES "
                "(gen_random_uuid(), %s, '{}', %s, now() - make_interval(mins => %s)) RETURNING id",
                [NAME, priority, 60 - priority],
            ).fetchone()[0]
            for priority in range(1, 6)
        ]
        assert claimer.statement()[2] and claimer.claim(limit=100) == []
        Lookout(SimpleNamespace(backends=[], queues=None), claimer.lanes, interval=10.0).look(beat, "10s")
        assert sorted(row[0] for row in claimer.claim(limit=100)) == sorted(ids)


def test_a_row_whose_insert_wrote_late_after_its_statement_began_is_not_left_behind_the_floors() -> None:
    # Its run_at is the statement's start; its transaction has no id until the first row is
    # written: the cap does not hold the floors below it, the sweep's lag does.
    with connect("default", "test claimer") as conn, connect("default", "writer") as writer:
        conn.autocommit = writer.autocommit = True
        claimer = drained(conn)
        done = threading.Event()

        def slow_insert() -> None:
            writer.execute(
                "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), %s, '{}' FROM (SELECT pg_sleep(0.3)) s",
                [NAME],
            )
            done.set()

        thread = threading.Thread(target=slow_insert)
        thread.start()
        taken: list[Any] = []
        while not done.is_set():  # claims while the statement runs, each walking to the end
            assert claimer.statement()[2]
            taken += claimer.claim(limit=100)
        thread.join()
        claimer.wait_bounded()
        taken += claimer.claim(limit=100)
        assert len(taken) == 1, "found by a claim from the floors, not left for the look"


def test_a_row_due_before_year_one_behind_the_floors_is_claimed_after_the_look() -> None:
    # Loading '-infinity' failed every look (review): the look now asks for a walk in full.
    with connect("default", "test claimer") as conn, connect("default", "heartbeat") as beat:
        conn.autocommit = True
        enqueue(conn, 5)
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim(limit=100))
        (later,) = conn.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) VALUES (gen_random_uuid(), %s, '{}', "
            "now() + interval '1 day') RETURNING id",
            [NAME],
        ).fetchone()
        conn.execute("UPDATE axa_queue SET run_at = '-infinity' WHERE id = %s", [later])  # no notification
        claimer.settle()
        assert claimer.statement()[2] and claimer.claim(limit=100) == []
        Lookout(SimpleNamespace(backends=[], queues=None), claimer.lanes, interval=10.0).look(beat, "10s")
        assert not claimer.statement()[2], "a walk in full next"
        assert [row[0] for row in claimer.claim(limit=100)] == [later]


def test_rows_of_a_transaction_running_at_a_claim_that_found_nothing_are_claimed_once_it_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bulk INSERT running while an idle worker's claim found nothing: its rows' run_at is
    # its statement's start; swept past it, 100,000 rows waited 8 s for the look.
    monkeypatch.setattr(lanes, "SWEPT_LAG", datetime.timedelta(0))  # the cap alone must hold the floors back
    with connect("default", "test claimer") as conn, connect("default", "writer") as writer:
        conn.autocommit, writer.autocommit = True, False
        claimer = drained(conn)
        (written,) = writer.execute(
            "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), %s, '{}' FROM generate_series(1, 3) "
            "RETURNING run_at",
            [NAME],
        ).fetchone()
        # The claim comes later than lanes.MARGIN after the INSERT began (a bulk INSERT's length).
        wait_for(lambda: conn.execute("SELECT now() > %s + interval '0.1 s'", [written]).fetchone()[0], what="0.1 s")
        assert claimer.statement()[2] and claimer.claim(limit=100) == []  # not committed yet: walked to the end
        writer.commit()
        assert len(claimer.claim(limit=1)) == 1  # its snapshot sees the writer done: the cap moves past its rows
        assert claimer.statement()[2] and len(claimer.claim(limit=100)) == 2, "found from the floors, not by a look"
