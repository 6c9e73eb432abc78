"""Races of the job page's "Run now" (admin.timeline.run_now) with the claim, a cancel and a retry.

Driven step by step as tests/test_races.py drives the others (tests/races.py): A holds
the row in an open transaction, B meets it and is shown to wait on its lock or to
complete; then A commits or rolls back. Run now is one guarded UPDATE by id through the
moving-row-safe queryset: it moves a job only while it is queued with run_at in the
future, and finds a row a retry moved out of the history meanwhile.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db.models.functions import Now

from axa_django import Job
from axa_django.admin.timeline import run_now
from axa_django.worker import connect
from tests.conftest import AXA_APPS
from tests.races import Actor, Move, Subject, check_invariants, claim, run_into, view, view_in, where
from tests.test_races import KEYED, MOVES, STATES

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def _scheduled(conn: psycopg.Connection[Any]) -> Subject:
    s = STATES["queued"](conn)
    Job.objects.filter(pk=s.id).update(run_at=Now() + datetime.timedelta(hours=1))
    return s


RUN_NOW_MOVE = Move("run now", lambda a, s: run_now(Job.objects.filter(pk=s.id)))


def move(label: str) -> Move:
    return RUN_NOW_MOVE if label == "run now" else MOVES[label]


def build(conn: psycopg.Connection[Any], kind: str) -> Subject:
    """The row as test_races.build makes it, or scheduled: queued, due in an hour (what Run now is for)."""
    s = _scheduled(conn) if kind == "scheduled" else STATES[kind](conn)
    s.loaded = {name: Job.objects.get(pk=s.id) for name in ("A", "B")}
    return s


def state(row: dict[str, Any] | None) -> str:
    """``where`` of the row, a queued one marked due (run_at passed) or later."""
    if row is None or row["status"] != "queued":
        return where(row)
    due = row["run_at"] <= datetime.datetime.now(datetime.UTC)
    return where(row) + (":due" if due else ":later")


W, C = True, False

# fmt: off
RUN_NOW = [
    # state        A holds the row  B meets it   waits commit: B, row            rollback: B, row
    ("scheduled",  "run now",       "CLAIM",     C, 0, "queued@queue:due",       0, "queued@queue:later"),
    ("scheduled",  "run now",       "run now",   W, 0, "queued@queue:due",       1, "queued@queue:due"),
    ("scheduled",  "run now",       "cancel",    W, 1, "cancelled@history",      1, "cancelled@history"),
    ("scheduled",  "cancel",        "run now",   W, 0, "cancelled@history",      1, "queued@queue:due"),
    ("scheduled",  "run now",       "retry",     C, 0, "queued@queue:due",       0, "queued@queue:later"),
    ("queued",     "CLAIM",         "run now",   W, 0, "running@queue",          0, "queued@queue:due"),
    # A retry queues a failed job to run now, out of the history: Run now finds it there, due.
    ("failed",     "retry",         "run now",   W, 0, "queued@queue:due",       0, "failed@history"),
]
# fmt: on


def _cases() -> Iterator[Any]:
    for row, a, b, waits, b_commit, row_commit, b_rollback, row_rollback in RUN_NOW:
        for commit, expected in ((True, (b_commit, row_commit)), (False, (b_rollback, row_rollback))):
            end = "commit" if commit else "rollback"
            yield pytest.param(row, a, b, waits, commit, expected, id=f"{row}: {a} vs {b}, {end}")


@pytest.fixture(scope="module")
def actors() -> Iterator[tuple[Actor, Actor]]:
    made = (Actor("A"), Actor("B"))
    yield made
    for actor in made:
        actor.close()


@pytest.fixture
def setup_conn() -> Iterator[psycopg.Connection[Any]]:
    with connect("default", "race setup") as conn:
        yield conn


@pytest.mark.parametrize(("kind", "a", "b", "waits", "commit", "expected"), list(_cases()))
def test_run_now_meets_the_claim_a_cancel_and_a_retry(
    actors: tuple[Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    kind: str,
    a: str,
    b: str,
    waits: bool,
    commit: bool,
    expected: tuple[int, str],
) -> None:
    holder, other = actors
    holder.ready()
    other.ready()
    s = build(setup_conn, kind)
    holder.begin()
    try:
        holder.call(move(a).run, holder, s)
        assert view_in(holder, move(a).via, s.id) is not None
    except BaseException:
        holder.end(False)
        raise
    [ran] = run_into(holder, [(other, move(b))], s, waits, commit)
    row = view(s.id)
    check_invariants([s.id] if row else [], [] if row else [s.id])
    assert (ran.get(), state(row)) == expected
    if state(row) == "queued@queue:due":
        # Due now: the next claim takes it.
        assert s.worker is not None
        assert [c.id for c in claim(setup_conn, [KEYED.name], s.worker)] == [s.id]
