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

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from axa_django import sql
from axa_django.execution import Claimed, finish
from axa_django.worker import connect
from tests.conftest import AXA_APPS
from tests.races import completed
from tests.test_claim_walk import insert

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
