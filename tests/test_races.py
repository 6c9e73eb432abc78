"""Races on one job row: every writer of axa_queue and its history against every other that can meet the row.

Each case is driven step by step (tests/races.py): actor A opens a transaction and runs
its statement on the row, holding the row's lock; actor B runs its statement in a thread
of its own and is shown to wait on that lock (``pg_stat_activity``), or, where it takes
no lock A holds, to complete; then A commits, or rolls back, and B finishes. After each
interleaving: one row per id across axa_queue and every history table, the job found by
id (unless it was deleted), the per-key counts of concurrency-limited jobs exact, no
waiting child without its edges, and what B returned is what a Django user expects.

Rows are made by the library's own enqueue and the worker's own claim; the worker's
statements run as the worker runs them (``execution.finish`` writes its outcomes with
sql.FINISH / FINISH_COMPLETED, sql.RESCUE, sql.HEARTBEAT, ...), on a worker's connection;
the seed's statements run verbatim with libpq parameters, as the Rust crate sends them.
A row's state is written ``status@table`` (``running+cancel`` when a cancel was asked):
``completed@history`` is a completed row in a history table, ``gone`` no row at all.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from axa_django import Job, conf, history, housekeeping, sql
from axa_django.execution import finish
from axa_django.models import Dependency
from axa_django.worker import connect
from tests.conftest import AXA_APPS
from tests.races import (
    Actor,
    Move,
    Ran,
    Subject,
    check_invariants,
    claim,
    completed,
    raised,
    register,
    run_into,
    seed_enqueue_and_claim,
    seed_run,
    view,
    view_in,
    where,
)
from tests.test_seed_sql import CLAIM as SEED_CLAIM
from tests.test_seed_sql import FINISH as SEED_FINISH
from tests.test_seed_sql import REQUEUE_STALE
from tests.testapp import flow_jobs
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

# A concurrency-limited job, so that every case also checks the per-key counts.
KEYED = flow_jobs.three_per_account
# The seed's test job (a Rust service's rows carry no key).
SEED_NAME = "CountWorker"


@pytest.fixture(scope="module")
def actors() -> Iterator[tuple[Actor, Actor, Actor]]:
    made = (Actor("A"), Actor("B"), Actor("C"))
    yield made
    for actor in made:
        actor.close()


@pytest.fixture
def setup_conn() -> Iterator[psycopg.Connection[Any]]:
    """A worker's connection for building rows (register, claim, finish) before a race."""
    with connect("default", "race setup") as conn:
        yield conn


# The states a row is raced in, built as a worker and the seed build them.


def _running(
    conn: psycopg.Connection[Any], attempts: int = 1, losses: int | None = None, ahead: bool = False
) -> Subject:
    worker = uuid.uuid4()
    register(conn, worker, [KEYED.name])
    KEYED.using(max_attempts=attempts, max_losses=losses).perform_later(account_id=1)
    [claimed] = claim(conn, [KEYED.name], worker, ahead=ahead)
    return Subject(claimed.id, KEYED.name, worker=worker, claimed=claimed, function=KEYED)


def _worker_dead(conn: psycopg.Connection[Any], s: Subject) -> Subject:
    """Its worker's heartbeat is older than the lease: the rescue takes it for dead (it may still finish)."""
    conn.execute("UPDATE axa_worker SET heartbeat_at = now() - interval '1 hour' WHERE id = %s", [s.worker])
    return s


def _started_long_ago(conn: psycopg.Connection[Any], s: Subject) -> Subject:
    """Running for two hours: past the seed's stale_minutes (60 here)."""
    conn.execute("UPDATE axa_queue SET started_at = now() - interval '2 hours' WHERE id = %s", [s.id])
    return s


def _worker_gone(conn: psycopg.Connection[Any], s: Subject) -> Subject:
    """Its worker is no longer registered (rescued as dead, or it stopped)."""
    conn.execute(sql.UNREGISTER, {"worker": s.worker})
    return s


def _queued(conn: psycopg.Connection[Any]) -> Subject:
    worker = uuid.uuid4()  # the worker that may claim it
    register(conn, worker, [KEYED.name])
    job = KEYED.using(max_attempts=1).perform_later(account_id=1)
    return Subject(job.pk, KEYED.name, worker=worker, function=KEYED)


def _failed(conn: psycopg.Connection[Any]) -> Subject:
    s = _running(conn)
    with conn.cursor() as cursor:
        assert finish(cursor, [raised(s.claimed, KEYED, s.worker)], s.worker) == set()
    return s


def _failed_in_place(conn: psycopg.Connection[Any]) -> Subject:
    """Failed, and kept in axa_queue itself (as a move the database refused leaves it: sql/refused.py)."""
    s = _failed(conn)
    conn.execute(
        "WITH gone AS (DELETE FROM ONLY axa_history WHERE id = %s RETURNING *) INSERT INTO axa_queue SELECT * FROM gone",
        [s.id],
    )
    return s


def _seed_running(conn: psycopg.Connection[Any]) -> Subject:
    job_id = seed_enqueue_and_claim(conn, SEED_NAME)
    return _started_long_ago(conn, Subject(job_id, SEED_NAME))


STATES: dict[str, Callable[[psycopg.Connection[Any]], Subject]] = {
    "running": _running,  # claimed by a live worker, no attempt left
    "running+retries": lambda conn: _running(conn, attempts=3),
    "ahead": lambda conn: _running(conn, ahead=True),  # claimed ahead of a free thread, not started
    "dead": lambda conn: _worker_dead(conn, _running(conn)),
    "dead+spent": lambda conn: _worker_dead(conn, _running(conn, losses=1)),  # the rescue fails it
    "stale live": lambda conn: _started_long_ago(conn, _running(conn)),
    "stale gone": lambda conn: _worker_gone(conn, _started_long_ago(conn, _running(conn))),
    "seed stale": _seed_running,  # claimed by the seed's CLAIM two hours ago (worker_id NULL)
    "queued": _queued,
    "failed": _failed,  # in the history
    "failed in place": _failed_in_place,
}


def build(conn: psycopg.Connection[Any], state: str) -> Subject:
    s = STATES[state](conn)
    s.loaded = {name: Job.objects.get(pk=s.id) for name in ("A", "B", "C")}
    return s


# The statements. Each returns what its caller gets, as a number where that is one.


def _finish(outcome_of: Callable[[Subject], Any], status: str) -> Callable[[Actor, Subject], int]:
    def run(actor: Actor, s: Subject) -> int:
        outcome = outcome_of(s)
        assert outcome.status == status, outcome
        with actor.worker_conn.cursor() as cursor:
            return int(s.id not in finish(cursor, [outcome], s.worker))

    return run


def _rescue(actor: Actor, s: Subject) -> int:
    params = {
        "lease": float(conf.get("LEASE_SECONDS")),
        "stale": int(conf.get("STALE_MINUTES")),
        "max_losses": int(conf.get("MAX_LOSSES")),
    }
    return len(actor.worker_conn.execute(sql.RESCUE, params).fetchall())


def _rescue_dead(actor: Actor, s: Subject) -> int:
    # The rescue between sweeps (worker/watchman.py): the rows of workers whose lease ran out.
    params = {"lease": float(conf.get("LEASE_SECONDS")), "max_losses": int(conf.get("MAX_LOSSES"))}
    return len(actor.worker_conn.execute(sql.RESCUE_DEAD, params).fetchall())


def _reconcile(actor: Actor, s: Subject) -> int:
    # As the watchman runs it for a worker that no longer holds the row (a crash lost its
    # outcome): nothing held, no grace, so this row is the one it takes.
    params = {"worker": s.worker, "held": [], "grace": 0}
    return len(actor.worker_conn.execute(sql.RECONCILE, params).fetchall())


def _heartbeat(actor: Actor, s: Subject) -> int:
    row = actor.worker_conn.execute(sql.HEARTBEAT, {"worker": s.worker, "ids": [s.id], "elect": False}).fetchone()
    return len(row[1])


def _release(actor: Actor, s: Subject) -> int:
    with actor.worker_conn.cursor() as cursor:
        cursor.execute(sql.RELEASE, {"ids": [s.id], "worker": s.worker})
        return cursor.rowcount


def _unclaim(actor: Actor, s: Subject) -> int:
    row = actor.worker_conn.execute(sql.UNCLAIM, {"ids": [s.id], "worker": s.worker}).fetchone()
    return row[0] if row else 0


def _mark_started(actor: Actor, s: Subject) -> int:
    params = {"ids": [s.id], "at": [time.time()], "worker": s.worker}
    return len(actor.worker_conn.execute(sql.MARK_STARTED, params).fetchall())


def _claim(actor: Actor, s: Subject) -> int:
    return len(claim(actor.worker_conn, [s.name], s.worker or uuid.uuid4()))


def _seed(statement: str, *params: str) -> Callable[[Actor, Subject], int]:
    def run(actor: Actor, s: Subject) -> int:
        return seed_run(actor.worker_conn, statement, *[str(s.id) if p == "$id" else p for p in params])[0]

    return run


def _seed_claim(actor: Actor, s: Subject) -> int:
    return len(seed_run(actor.worker_conn, SEED_CLAIM, "{" + s.name + "}")[1])


def _fields(job: Job) -> dict[str, Any]:
    """A loaded job's fields, as races.ROW reads them (its table aside)."""
    return {
        "status": job.status,
        "attempts": job.attempts,
        "worker_id": job.worker_id,
        "cancel_requested": job.cancel_requested,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "run_at": job.run_at,
        "error": job.error,
        "errors": len(job.errors),
        "losses": job.losses,
        "priority": job.priority,
        "pending_parents": job.pending_parents,
    }


def _save(actor: Actor, s: Subject) -> None:
    job = s.loaded[actor.name]
    job.priority = 7
    job.save()


def _sfu_get(actor: Actor, s: Subject) -> dict[str, Any]:
    with transaction.atomic():
        return _fields(Job.objects.select_for_update().get(pk=s.id))


def _sfu_in(actor: Actor, s: Subject) -> list[dict[str, Any]]:
    with transaction.atomic():
        return [_fields(job) for job in Job.objects.select_for_update().filter(pk__in=[s.id])]


def _refresh(actor: Actor, s: Subject) -> dict[str, Any]:
    job = s.loaded[actor.name]
    job.refresh_from_db()
    return _fields(job)


MOVES = {
    move.label: move
    for move in [
        # The worker's.
        Move("FINISH ok", _finish(lambda s: completed(s.claimed), "completed"), "worker"),
        Move("FINISH failed", _finish(lambda s: raised(s.claimed, s.function, s.worker), "failed"), "worker"),
        Move("FINISH retry", _finish(lambda s: raised(s.claimed, s.function, s.worker), "queued"), "worker"),
        Move("RESCUE", _rescue, "worker"),
        Move("RESCUE_DEAD", _rescue_dead, "worker"),
        Move("RECONCILE", _reconcile, "worker"),
        Move("HEARTBEAT", _heartbeat, "worker"),
        Move("RELEASE", _release, "worker"),
        Move("UNCLAIM", _unclaim, "worker"),
        Move("MARK_STARTED", _mark_started, "worker"),
        Move("CLAIM", _claim, "worker"),
        # The seed's, verbatim.
        Move("seed CLAIM", _seed_claim, "worker"),
        Move("seed FINISH", _seed(SEED_FINISH, "$id", "completed", None), "worker"),  # type: ignore[arg-type]
        Move("REQUEUE_STALE", _seed(REQUEUE_STALE, "60"), "worker"),
        # The queryset's and the admin's: the admin's retry and cancel buttons run
        # Job.objects.filter(pk=...).retry() / .cancel(), its delete job.delete().
        Move("cancel", lambda a, s: Job.objects.filter(pk=s.id).cancel()),
        Move("job.cancel", lambda a, s: int(s.loaded[a.name].cancel())),
        Move("retry", lambda a, s: int(Job.objects.filter(pk=s.id).retry())),
        Move("retry_selected", lambda a, s: int(Job.objects.filter(pk__in=[s.id]).retry())),
        Move("job.retry", lambda a, s: int(s.loaded[a.name].retry())),
        Move("cancel_selected", lambda a, s: Job.objects.filter(pk__in=[s.id]).cancel()),
        # The ORM's, by id.
        Move("save", _save),
        Move("update", lambda a, s: Job.objects.filter(pk=s.id).update(priority=7)),
        Move("delete", lambda a, s: Job.objects.filter(pk=s.id).delete()),
        Move("job.delete", lambda a, s: s.loaded[a.name].delete()),
        # The admin's "delete selected" action: its changelist's queryset, by the ids ticked.
        Move("delete_selected", lambda a, s: Job.objects.filter(pk__in=[s.id]).delete()),
        Move("sfu.get", _sfu_get),
        Move("sfu.in", _sfu_in),
        Move("refresh", _refresh),
        Move("insert id", lambda a, s: Job(id=s.id, name=s.name, args={"account_id": 1}).save()),
        Move("create id", lambda a, s: Job.objects.create(id=s.id, name=s.name, args={"account_id": 1})),
    ]
}


def start(holder: Actor, state_subject: Subject, label: str) -> dict[str, Any] | None:
    """A begins, runs its statement and reads the row as its transaction sees it (its writes included)."""
    move = MOVES[label]
    holder.begin()
    try:
        holder.call(move.run, holder, state_subject)
        return view_in(holder, move.via, state_subject.id)
    except BaseException:
        holder.end(False)
        raise


# 1. The worker's statements, the seed's, the admin's retry and cancel, against each other.
#
# state: the row before; A holds it; B meets it: B waits (W) or completes (C) while A holds
# it; then, after A commits and after A rolls back: what B returned (rows it changed or
# reported; for FINISH 1 if it wrote the outcome) and the row's state.

W, C = True, False

# fmt: off
PAIRS = [
    # state             A holds the row  B meets it      waits commit: B, row             rollback: B, row
    ("running",         "FINISH ok",     "cancel",          W, 0, "completed@history",    1, "running+cancel@queue"),
    ("running",         "FINISH ok",     "job.cancel",      W, 0, "completed@history",    1, "running+cancel@queue"),
    ("running",         "FINISH failed", "cancel",          W, 0, "failed@history",       1, "running+cancel@queue"),
    ("running",         "FINISH ok",     "retry",           C, 0, "completed@history",    0, "running@queue"),
    ("running",         "FINISH failed", "retry",           C, 0, "failed@history",       0, "running@queue"),
    ("running",         "FINISH ok",     "HEARTBEAT",       C, 0, "completed@history",    0, "running@queue"),
    ("running",         "FINISH ok",     "seed FINISH",     W, 0, "completed@history",    1, "completed@history"),
    ("running",         "FINISH failed", "seed FINISH",     W, 0, "failed@history",       1, "completed@history"),
    ("running",         "FINISH ok",     "RELEASE",         W, 0, "completed@history",    1, "queued@queue"),
    ("running",         "FINISH ok",     "CLAIM",           C, 0, "completed@history",    0, "running@queue"),
    ("running+retries", "FINISH retry",  "retry",           C, 0, "queued@queue",         0, "running@queue"),
    ("running+retries", "FINISH retry",  "RELEASE",         W, 0, "queued@queue",         1, "queued@queue"),
    ("running+retries", "FINISH retry",  "seed FINISH",     W, 1, "completed@history",    1, "completed@history"),
    ("running+retries", "FINISH retry",  "CLAIM",           C, 0, "queued@queue",         0, "running@queue"),
    ("running+retries", "FINISH retry",  "HEARTBEAT",       C, 0, "queued@queue",         0, "running@queue"),
    # A cancel waiting on a finish that queues the row again cancels it as it then is (two
    # statements, one for queued rows and one for running ones, missed it both times).
    ("running+retries", "FINISH retry",  "cancel",          W, 1, "cancelled@history",    1, "running+cancel@queue"),
    ("running+retries", "cancel",        "FINISH retry",    W, 1, "cancelled@history",    1, "queued@queue"),
    ("dead",            "FINISH ok",     "RESCUE",          C, 0, "completed@history",    0, "running@queue"),
    ("dead+spent",      "FINISH ok",     "RESCUE",          C, 0, "completed@history",    0, "running@queue"),
    ("stale gone",      "FINISH ok",     "REQUEUE_STALE",   W, 0, "completed@history",    1, "queued@queue"),
    ("stale live",      "FINISH ok",     "REQUEUE_STALE",   W, 0, "completed@history",    0, "running@queue"),
    ("ahead",           "FINISH ok",     "MARK_STARTED",    C, 0, "completed@history",    0, "running@queue"),
    ("ahead",           "FINISH ok",     "UNCLAIM",         W, 0, "completed@history",    1, "queued@queue"),
    # ... and the finisher meeting the others' locks.
    ("dead",            "RESCUE",        "FINISH ok",       W, 0, "queued@queue",         1, "completed@history"),
    ("dead+spent",      "RESCUE",        "FINISH ok",       W, 0, "failed@history",       1, "completed@history"),
    ("stale gone",      "REQUEUE_STALE", "FINISH ok",       W, 0, "queued@queue",         1, "completed@history"),
    ("stale live",      "REQUEUE_STALE", "FINISH ok",       W, 1, "completed@history",    1, "completed@history"),
    ("ahead",           "MARK_STARTED",  "FINISH ok",       W, 1, "completed@history",    1, "completed@history"),
    ("ahead",           "UNCLAIM",       "FINISH ok",       W, 0, "queued@queue",         1, "completed@history"),
    # The reconcile (a crash lost what the worker wrote) takes only rows no one holds a lock on.
    ("running",         "FINISH ok",     "RECONCILE",       C, 0, "completed@history",    0, "running@queue"),
    ("running",         "RECONCILE",     "FINISH ok",       W, 0, "queued@queue",         1, "completed@history"),
    ("running",         "RECONCILE",     "cancel",          W, 1, "cancelled@history",    1, "running+cancel@queue"),
    ("running",         "cancel",        "RECONCILE",       C, 0, "running+cancel@queue", 0, "running@queue"),
    ("dead",            "RESCUE",        "RECONCILE",       C, 0, "queued@queue",         0, "running@queue"),
    ("running",         "RECONCILE",     "CLAIM",           C, 0, "queued@queue",         0, "running@queue"),
    ("running",         "cancel",        "FINISH ok",       W, 1, "completed@history",    1, "completed@history"),
    ("running",         "cancel",        "HEARTBEAT",       C, 0, "running+cancel@queue", 0, "running@queue"),
    ("running",         "RELEASE",       "FINISH ok",       W, 0, "queued@queue",         1, "completed@history"),
    ("running",         "seed FINISH",   "FINISH ok",       W, 0, "completed@history",    1, "completed@history"),
    ("running",         "save",          "FINISH ok",       W, 1, "completed@history",    1, "completed@history"),
    ("running",         "update",        "FINISH failed",   W, 1, "failed@history",       1, "failed@history"),
    ("running",         "job.delete",    "FINISH ok",       W, 0, "gone",                 1, "completed@history"),
    ("running",         "sfu.get",       "FINISH ok",       W, 1, "completed@history",    1, "completed@history"),
    ("dead",            "save",          "RESCUE",          C, 0, "running@queue",        0, "running@queue"),
    ("ahead",           "save",          "MARK_STARTED",    C, 0, "running@queue",        0, "running@queue"),
    # A queued row: claims, cancels, the admin's delete.
    ("queued",          "CLAIM",         "cancel",          W, 1, "running+cancel@queue", 1, "cancelled@history"),
    ("queued",          "cancel",        "cancel",          W, 0, "cancelled@history",    1, "cancelled@history"),
    ("queued",          "cancel",        "CLAIM",           C, 0, "cancelled@history",    0, "queued@queue"),
    ("queued",          "CLAIM",         "CLAIM",           C, 0, "running@queue",        0, "queued@queue"),
    ("queued",          "CLAIM",         "seed CLAIM",      C, 0, "running@queue",        0, "queued@queue"),
    ("queued",          "seed CLAIM",    "CLAIM",           C, 0, "running@queue",        0, "queued@queue"),
    ("queued",          "job.delete",    "cancel",          W, 0, "gone",                 1, "cancelled@history"),
    ("queued",          "cancel",        "cancel_selected", W, 0, "cancelled@history",    1, "cancelled@history"),
    ("queued",          "save",          "CLAIM",           C, 0, "queued@queue",         0, "queued@queue"),
    # A row the seed claimed (a Rust worker's), two hours ago.
    ("seed stale",      "seed FINISH",   "REQUEUE_STALE",   W, 0, "completed@history",    1, "queued@queue"),
    ("seed stale",      "REQUEUE_STALE", "seed FINISH",     W, 1, "completed@history",    1, "completed@history"),
    ("seed stale",      "seed FINISH",   "RESCUE",          C, 0, "completed@history",    0, "running@queue"),
    ("seed stale",      "RESCUE",        "REQUEUE_STALE",   W, 0, "queued@queue",         1, "queued@queue"),
    ("seed stale",      "seed FINISH",   "cancel",          W, 0, "completed@history",    1, "running+cancel@queue"),
    # A failed row in the history: the admin's retry moves it back to axa_queue (sql/retry.py).
    ("failed",          "retry",         "retry",           W, 0, "queued@queue",         1, "queued@queue"),
    ("failed",          "retry",         "retry_selected",  W, 0, "queued@queue",         1, "queued@queue"),
    ("failed",          "retry",         "job.retry",       W, 0, "queued@queue",         1, "queued@queue"),
    ("failed",          "retry",         "cancel",          C, 0, "queued@queue",         0, "failed@history"),
    ("failed",          "retry",         "CLAIM",           C, 0, "queued@queue",         0, "failed@history"),
    ("failed",          "job.delete",    "retry",           W, 0, "gone",                 1, "queued@queue"),
    ("failed",          "update",        "retry",           W, 1, "queued@queue",         1, "queued@queue"),
    ("failed in place", "retry",         "retry_selected",  W, 0, "queued@queue",         1, "queued@queue"),
    ("failed in place", "job.delete",    "retry",           W, 0, "gone",                 1, "queued@queue"),
    # A heartbeat that revives a worker taken for dead: the rescue waits on its row and takes
    # nothing once it commits; the row stays with its worker, which runs it.
    ("dead",            "HEARTBEAT",     "RESCUE",          W, 0, "running@queue",        1, "queued@queue"),
    ("dead",            "RESCUE",        "HEARTBEAT",       W, 0, "queued@queue",         0, "running@queue"),
    # The rescue between sweeps takes only rows of workers whose lease ran out.
    ("running",         "FINISH ok",     "RESCUE_DEAD",     C, 0, "completed@history",    0, "running@queue"),
    ("stale gone",      "FINISH ok",     "RESCUE_DEAD",     C, 0, "completed@history",    0, "running@queue"),
    ("seed stale",      "seed FINISH",   "RESCUE_DEAD",     C, 0, "completed@history",    0, "running@queue"),
]
# fmt: on


def _as_rescue_dead(table: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows of ``table`` where the sweep (RESCUE) meets a dead worker's row, with RESCUE_DEAD instead:
    for those rows it does what the sweep does."""
    return [
        tuple("RESCUE_DEAD" if cell == "RESCUE" else cell for cell in row)
        for row in table
        if row[0] in ("dead", "dead+spent") and "RESCUE" in row[1:3]
    ]


PAIRS += _as_rescue_dead(PAIRS)


def _pairs(table: list[tuple[Any, ...]] = PAIRS) -> Iterator[Any]:
    """Each row of ``table`` twice: B's outcome and the row's end state after A commits, then after A rolls back."""
    for state, a, b, waits, b_commit, row_commit, b_rollback, row_rollback in table:
        for commit, expected in ((True, (b_commit, row_commit)), (False, (b_rollback, row_rollback))):
            end = "commit" if commit else "rollback"
            yield pytest.param(state, a, b, waits, commit, expected, id=f"{state}: {a} vs {b}, {end}")


@pytest.mark.parametrize(("state", "a", "b", "waits", "commit", "expected"), list(_pairs()))
def test_statement_meets_statement(
    actors: tuple[Actor, Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    state: str,
    a: str,
    b: str,
    waits: bool,
    commit: bool,
    expected: tuple[int, str],
) -> None:
    holder, other, _ = actors
    holder.ready()
    other.ready()
    s = build(setup_conn, state)
    start(holder, s, a)
    [ran] = run_into(holder, [(other, MOVES[b])], s, waits, commit)
    row = view(s.id)
    check_invariants([s.id] if row else [], [] if row else [s.id])
    assert (ran.get(), where(row)) == expected


# 2. The ORM's reads and writes by id (and the admin's delete) against every statement that
# moves a row (into the history, back out of it) or changes it in place.
#
# Whatever A did, B acts on the row where it is now: a save writes only the field it
# changed (priority), everything A wrote stays; select_for_update returns the row as A
# left it; update and delete find it; an insert of its id is refused. After a rollback, B
# acts on the row as it was. A refresh takes no lock and reads the row as it was.

# fmt: off
MOVERS = [
    # state             A holds the row    what A does to it
    ("running",         "FINISH ok"),      # -> completed, moved into the history
    ("running",         "FINISH failed"),  # -> failed, moved
    ("running+retries", "FINISH retry"),   # -> queued again, in place
    ("running",         "cancel"),         # cancel_requested, in place
    ("dead",            "RESCUE"),         # -> queued, in place
    ("dead+spent",      "RESCUE"),         # -> failed, moved by axa_history_keep
    ("running",         "RELEASE"),        # -> queued, in place
    ("ahead",           "UNCLAIM"),        # -> queued, in place
    ("running",         "RECONCILE"),      # -> queued, in place
    ("queued",          "CLAIM"),          # -> running, in place
    ("queued",          "cancel"),         # -> cancelled, moved by axa_history_keep
    ("seed stale",      "seed FINISH"),    # -> completed, moved by axa_history_keep
    ("seed stale",      "REQUEUE_STALE"),  # -> queued, in place
    ("failed",          "retry"),          # -> queued, moved back to axa_queue by the retry
    ("failed in place", "retry"),          # -> queued, in place
    ("queued",          "job.delete"),     # -> gone
    ("dead",            "RESCUE_DEAD"),    # -> queued, in place
    ("dead+spent",      "RESCUE_DEAD"),    # -> failed, moved by axa_history_keep
]
# fmt: on
# Each meets: (B, whether B waits on A's lock).
# fmt: off
BY_ID = [
    # B meets it         B waits
    ("save",             W),
    ("update",           W),
    ("delete",           W),
    ("job.delete",       W),
    ("delete_selected",  W),
    ("sfu.get",          W),
    ("sfu.in",           W),
    ("refresh",          C),
    ("insert id",        None),  # refused before or after waiting: either way, nothing is inserted
    ("create id",        None),
]
# fmt: on
UNCHANGED = ("errors", "status", "attempts", "worker_id", "cancel_requested", "started_at", "finished_at")
COMPARED = (*UNCHANGED, "run_at", "error", "losses", "priority", "pending_parents")


def _by_id() -> Iterator[Any]:
    for state, a in MOVERS:
        for b, waits in BY_ID:
            if a == "job.delete" and b in ("insert id", "create id"):
                continue  # the id is free again once the delete commits
            for commit in (True, False):
                end = "commit" if commit else "rollback"
                yield pytest.param(state, a, b, waits, commit, id=f"{state}: {a} vs {b}, {end}")


def same(found: dict[str, Any] | None, expected: dict[str, Any] | None, *, priority: int | None = None) -> None:
    """``found`` is ``expected`` (its fields, and its table where both have one), with ``priority`` if given."""
    if expected is None:
        assert found is None
        return
    assert found is not None, f"the row is gone; expected {where(expected)}"
    wanted = {name: expected[name] for name in COMPARED}
    if priority is not None:
        wanted["priority"] = priority
    assert {name: found[name] for name in COMPARED} == wanted
    if "table" in found:
        assert found["table"] == expected["table"], "the row is not where the holder left it"


def check_by_id(b: str, ran: Ran, before: dict[str, Any], expected: dict[str, Any] | None, row: Any) -> None:
    """What a Django user expects of B, which met the row as ``expected`` (None: gone) and left it as ``row``."""
    gone = expected is None
    if b == "save":
        if gone:
            assert isinstance(ran.error, DatabaseError), f"save of a deleted job should raise, not {ran}"
        else:
            assert ran.error is None, f"save raised {ran.error!r}"
        same(row, expected, priority=7)
    elif b == "update":
        assert ran.get() == (0 if gone else 1)
        same(row, expected, priority=7)
    elif b in ("delete", "job.delete", "delete_selected"):
        count, per_model = ran.get()
        assert (count, per_model.get("axa_django.Job", 0)) == ((0, 0) if gone else (1, 1))
        assert row is None
    elif b == "sfu.get":
        if gone:
            assert isinstance(ran.error, Job.DoesNotExist), ran
        else:
            same(ran.get(), expected)
        same(row, expected)
    elif b == "sfu.in":
        assert len(ran.get()) == (0 if gone else 1)
        if not gone:
            same(ran.get()[0], expected)
        same(row, expected)
    elif b == "refresh":
        same(ran.get(), before)  # read without waiting: the row before A's statement
        same(row, expected)
    else:  # an insert of the job's id
        assert isinstance(ran.error, IntegrityError), f"an insert of a taken id should be refused, not {ran}"
        same(row, expected)


@pytest.mark.parametrize(("state", "a", "b", "waits", "commit"), list(_by_id()))
def test_a_read_or_write_by_id_finds_the_row_where_it_is(
    actors: tuple[Actor, Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    state: str,
    a: str,
    b: str,
    waits: bool | None,
    commit: bool,
) -> None:
    holder, other, _ = actors
    holder.ready()
    other.ready()
    s = build(setup_conn, state)
    before = view(s.id)
    assert before is not None
    held = start(holder, s, a)
    [ran] = run_into(holder, [(other, MOVES[b])], s, waits, commit)
    expected = held if commit else before
    row = view(s.id)
    deleted = row is None and (expected is None or b in ("delete", "job.delete", "delete_selected"))
    check_invariants([] if deleted else [s.id], [s.id] if deleted else [])
    check_by_id(b, ran, before, expected, row)


# Three connections: two statements wait on one holder, and both find the row after it moved.
# fmt: off
THREE = [
    # state     A holds the row  B writes  C locks and reads
    ("running", "FINISH ok",     "save",   "sfu.get"),
    ("running", "FINISH failed", "update", "sfu.in"),
    ("failed",  "retry",         "save",   "sfu.get"),
    ("queued",  "cancel",        "update", "sfu.get"),
]
# fmt: on


@pytest.mark.parametrize(("state", "a", "b", "c"), [pytest.param(*row, id=" vs ".join(row)) for row in THREE])
def test_two_statements_wait_on_one_mover_and_both_find_the_row(
    actors: tuple[Actor, Actor, Actor], setup_conn: psycopg.Connection[Any], state: str, a: str, b: str, c: str
) -> None:
    holder, first, second = actors
    for actor in actors:
        actor.ready()
    s = build(setup_conn, state)
    held = start(holder, s, a)
    assert held is not None
    wrote, read = run_into(holder, [(first, MOVES[b]), (second, MOVES[c])], s, True, True)
    row = view(s.id)
    check_invariants([s.id])
    check_by_id(b, wrote, held, held, row)
    # C read the row as A left it, before or after B's write (the priority is the one field B writes).
    found = read.get()[0] if c == "sfu.in" else read.get()
    same({**found, "priority": held["priority"]}, held)


# 3. Retention: the close and the drop of a history table (as housekeeping runs them:
# its timeouts, the rotation's advisory lock) against the retry of a failed parent whose
# failure cancelled its child. A retry moves both out of the table (the child waits
# again, on its parent): the drop must not delete their edges, or the child waits for
# ever with pending_parents = 1 and no edge to count it down.


@pytest.fixture
def patient_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    # Housekeeping gives up a rename or a drop after 100 ms (1 s for the whole step) and tries
    # again later: here the statement must still be waiting when the other commits.
    monkeypatch.setattr(history, "LOCK_TIMEOUT", "20s")
    monkeypatch.setattr(housekeeping, "LOCK_TIMEOUT", 20.0)


def _workflow_failed(conn: psycopg.Connection[Any]) -> Subject:
    """A parent that failed on a worker, and its child, cancelled by that failure; both in the history."""
    worker = uuid.uuid4()
    register(conn, worker, [wj.noop.name])
    parent = wj.noop.perform_later(1)
    child = wj.noop.using(after=[parent]).perform_later(2)
    [claimed] = claim(conn, [wj.noop.name], worker)
    assert claimed.id == parent.pk
    with conn.cursor() as cursor:
        assert finish(cursor, [raised(claimed, wj.noop, worker)], worker) == set()
    s = Subject(parent.pk, wj.noop.name, worker=worker, claimed=claimed, function=wj.noop, others={"child": child.pk})
    assert (where(view(parent.pk)), where(view(child.pk))) == ("failed@history", "cancelled@history")
    return s


def _prepared() -> None:
    """Tables earlier tests closed dropped, and the next table made: the open one can be closed."""
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            if history.drop(cursor, datetime.timedelta(0)) is None:
                break
    with transaction.atomic(), connection.cursor() as cursor:
        history.prepare(cursor)


def _close_now() -> None:
    _prepared()
    with transaction.atomic(), connection.cursor() as cursor:
        assert history.close(cursor, datetime.timedelta(0)) is not None


def _rotate(step: Callable[[Any, datetime.timedelta], int | None]) -> Callable[[Actor, Subject], int | None]:
    def run(actor: Actor, s: Subject) -> int | None:
        with housekeeping.bounded("default"), connection.cursor() as cursor:
            return step(cursor, datetime.timedelta(0))

    return run


RETENTION_MOVES = {
    "retry": Move("retry", MOVES["retry"].run),
    "drop": Move("drop", _rotate(history.drop)),
    "close": Move("close", _rotate(history.close)),
}

# fmt: off
RETENTION = [
    # A holds  B waits  rows' table  commit: retry gave, parent, child          rollback: retry gave, parent, child
    ("retry",  "drop",  "closed",    1, "queued@queue", "waiting@queue",        0, "gone", "gone"),
    ("drop",   "retry", "closed",    0, "gone", "gone",                         1, "queued@queue", "waiting@queue"),
    ("retry",  "close", "open",      1, "queued@queue", "waiting@queue",        0, "failed@history", "cancelled@history"),
    ("close",  "retry", "open",      1, "queued@queue", "waiting@queue",        1, "queued@queue", "waiting@queue"),
]
# fmt: on


def _retention() -> Iterator[Any]:
    for a, b, table, *after in RETENTION:
        for commit, expected in ((True, after[:3]), (False, after[3:])):
            end = "commit" if commit else "rollback"
            yield pytest.param(a, b, table, commit, tuple(expected), id=f"{a} vs {b}, {end}")


@pytest.mark.parametrize(("a", "b", "table", "commit", "expected"), list(_retention()))
@pytest.mark.usefixtures("patient_retention")
def test_retention_meets_a_retry_and_strands_no_child(
    actors: tuple[Actor, Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    a: str,
    b: str,
    table: str,
    commit: bool,
    expected: tuple[int, str, str],
) -> None:
    holder, other, _ = actors
    holder.ready()
    other.ready()
    s = _workflow_failed(setup_conn)
    child = s.others["child"]
    _close_now() if table == "closed" else _prepared()
    holder.begin()
    try:
        held = holder.call(RETENTION_MOVES[a].run, holder, s)
    except BaseException:
        holder.end(False)
        raise
    [ran] = run_into(holder, [(other, RETENTION_MOVES[b])], s, True, commit)
    retried = (held if commit else 0) if a == "retry" else ran.get()  # a retry rolled back queued nothing
    rotated = ran.get() if a == "retry" else held
    assert rotated is not None, f"the {a if a != 'retry' else b} did nothing"
    parent_row, child_row = view(s.id), view(child)
    present = [job for job, row in ((s.id, parent_row), (child, child_row)) if row is not None]
    check_invariants(present, [job for job in (s.id, child) if job not in present])
    assert (int(retried), where(parent_row), where(child_row)) == expected
    if child_row is not None and child_row["status"] == "waiting":
        edges = list(Dependency.objects.filter(child_id=child).values_list("parent_id", "done"))
        assert (child_row["pending_parents"], edges) == (1, [(s.id, False)])


# 4. A mixed fleet: the seed's REQUEUE_STALE, run verbatim by a Rust service at its start,
# requeues a row running past stale_minutes, unless its Django worker is alive.

# fmt: off
STALE = [
    # the row's worker                  requeued
    ("a live worker (registered)",      False),
    ("a worker no longer registered",   True),
    ("none: claimed by the seed",       True),
]
# fmt: on


@pytest.mark.parametrize(("owner", "requeued"), STALE, ids=[row[0] for row in STALE])
def test_requeue_stale_spares_a_live_workers_job(
    setup_conn: psycopg.Connection[Any], owner: str, requeued: bool
) -> None:
    if owner.startswith("none"):
        s = _seed_running(setup_conn)
    else:
        s = _started_long_ago(setup_conn, _running(setup_conn))
        if "no longer" in owner:
            _worker_gone(setup_conn, s)
    changed, _ = seed_run(setup_conn, REQUEUE_STALE, "60")
    assert (changed, where(view(s.id))) == (int(requeued), "queued@queue" if requeued else "running@queue")
    check_invariants([s.id])


# Beyond the races: a cancel asked of a running job was lost when its attempt ended in a
# retry (FINISH's retry branch queued the row with cancel_requested still set, and the next
# claim cleared it): the job ran again although the user had cancelled it.


def test_a_cancel_asked_of_a_running_job_survives_a_retry_of_its_attempt(setup_conn: psycopg.Connection[Any]) -> None:
    s = build(setup_conn, "running+retries")
    assert Job.objects.filter(pk=s.id).cancel() == 1
    with setup_conn.cursor() as cursor:
        assert finish(cursor, [raised(s.claimed, KEYED, s.worker)], s.worker) == set()
    check_invariants([s.id])
    job = Job.objects.get(pk=s.id)
    assert job.status == "cancelled", f"cancelled, then its attempt failed: the job is {job.status}, to run again"


# 4. An attempt lost to the database (its connection died under the job, issue 45): the
# finisher writes it through FINISH's retry branch, which gives the attempt back and
# counts a loss, and fails the job once its losses reach max_losses ("+spent": 1).


def _lost(s: Subject) -> Any:
    from axa_django.execution import lost

    assert s.claimed is not None
    return lost(s.claimed, "server closed the connection unexpectedly", "Traceback ...", s.worker)


MOVES["FINISH lost"] = Move("FINISH lost", _finish(_lost, "queued"), "worker")
STATES["running+spent"] = lambda conn: _running(conn, losses=1)

# fmt: off
LOST = [
    # state             A holds the row  B meets it      waits commit: B, row             rollback: B, row
    ("running",         "FINISH lost",   "cancel",          W, 1, "cancelled@history",    1, "running+cancel@queue"),
    ("running",         "cancel",        "FINISH lost",     W, 1, "cancelled@history",    1, "queued@queue"),
    ("running",         "FINISH lost",   "CLAIM",           C, 0, "queued@queue",         0, "running@queue"),
    ("running",         "FINISH lost",   "RECONCILE",       C, 0, "queued@queue",         0, "running@queue"),
    ("running",         "FINISH lost",   "RELEASE",         W, 0, "queued@queue",         1, "queued@queue"),
    ("dead",            "RESCUE",        "FINISH lost",     W, 0, "queued@queue",         1, "queued@queue"),
    ("dead",            "FINISH lost",   "RESCUE",          C, 0, "queued@queue",         0, "running@queue"),
    ("running+spent",   "FINISH lost",   "cancel",          W, 0, "failed@history",       1, "running+cancel@queue"),
    ("running+spent",   "FINISH lost",   "retry",           C, 0, "failed@history",       0, "running@queue"),
    ("running+spent",   "cancel",        "FINISH lost",     W, 1, "failed@history",       1, "failed@history"),
    ("dead+spent",      "RESCUE",        "FINISH lost",     W, 0, "failed@history",       1, "failed@history"),
]
# fmt: on
LOST += _as_rescue_dead(LOST)


@pytest.mark.parametrize(("state", "a", "b", "waits", "commit", "expected"), list(_pairs(LOST)))
def test_an_attempt_lost_to_the_database_meets_statement(
    actors: tuple[Actor, Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    state: str,
    a: str,
    b: str,
    waits: bool,
    commit: bool,
    expected: tuple[int, str],
) -> None:
    test_statement_meets_statement(actors, setup_conn, state, a, b, waits, commit, expected)


# 5. More of an attempt lost to the database: the ORM's writes by id, the seed's statements,
# rows claimed ahead and the heartbeat against FINISH lost, and FINISH lost (queued again in
# place; failed and moved, "+spent") among the movers the reads and writes by id meet. A row
# claimed ahead that FINISH lost fails writes its started_at ("ahead+spent"). Each test runs
# a group of cases, each case's row and worker deleted after it: a transactional test's
# flush costs four times a case here, so one test per case would have cost that much more.

STATES["ahead+spent"] = lambda conn: _running(conn, losses=1, ahead=True)

# fmt: off
LOST_MORE = {
    "the ORM by id": [
        # state             A holds the row    B meets it      waits commit: B, row            rollback: B, row
        ("running",         "delete",          "FINISH lost",     W, 0, "gone",                1, "queued@queue"),
        ("running",         "job.delete",      "FINISH lost",     W, 0, "gone",                1, "queued@queue"),
        ("running",         "delete_selected", "FINISH lost",     W, 0, "gone",                1, "queued@queue"),
        ("running",         "save",            "FINISH lost",     W, 1, "queued@queue",        1, "queued@queue"),
        ("running",         "update",          "FINISH lost",     W, 1, "queued@queue",        1, "queued@queue"),
        ("running",         "sfu.get",         "FINISH lost",     W, 1, "queued@queue",        1, "queued@queue"),
        ("running+spent",   "update",          "FINISH lost",     W, 1, "failed@history",      1, "failed@history"),
        ("running+spent",   "job.delete",      "FINISH lost",     W, 0, "gone",                1, "failed@history"),
    ],
    "the seed's statements": [
        ("stale gone",      "FINISH lost",     "REQUEUE_STALE",   W, 0, "queued@queue",        1, "queued@queue"),
        ("stale gone",      "REQUEUE_STALE",   "FINISH lost",     W, 0, "queued@queue",        1, "queued@queue"),
        ("stale live",      "FINISH lost",     "REQUEUE_STALE",   W, 0, "queued@queue",        0, "running@queue"),
        ("stale live",      "REQUEUE_STALE",   "FINISH lost",     W, 1, "queued@queue",        1, "queued@queue"),
        ("running",         "FINISH lost",     "seed FINISH",     W, 1, "completed@history",   1, "completed@history"),
        ("running",         "seed FINISH",     "FINISH lost",     W, 0, "completed@history",   1, "queued@queue"),
        ("running+spent",   "FINISH lost",     "seed FINISH",     W, 0, "failed@history",      1, "completed@history"),
    ],
    "claimed ahead, the heartbeat": [
        ("ahead",           "FINISH lost",     "MARK_STARTED",    C, 0, "queued@queue",        0, "running@queue"),
        ("ahead",           "MARK_STARTED",    "FINISH lost",     W, 1, "queued@queue",        1, "queued@queue"),
        ("ahead",           "FINISH lost",     "UNCLAIM",         W, 0, "queued@queue",        1, "queued@queue"),
        ("ahead",           "UNCLAIM",         "FINISH lost",     W, 0, "queued@queue",        1, "queued@queue"),
        ("ahead+spent",     "FINISH lost",     "MARK_STARTED",    C, 0, "failed@history",      0, "running@queue"),
        ("ahead+spent",     "MARK_STARTED",    "FINISH lost",     W, 1, "failed@history",      1, "failed@history"),
        ("ahead+spent",     "FINISH lost",     "UNCLAIM",         W, 0, "failed@history",      1, "queued@queue"),
        ("ahead+spent",     "UNCLAIM",         "FINISH lost",     W, 0, "queued@queue",        1, "failed@history"),
        ("running",         "FINISH lost",     "HEARTBEAT",       C, 0, "queued@queue",        0, "running@queue"),
        ("running+spent",   "FINISH lost",     "HEARTBEAT",       C, 0, "failed@history",      0, "running@queue"),
    ],
}
# The movers the reads and writes by id (BY_ID) meet, as MOVERS.
LOST_MOVERS = [
    # state             A holds the row    what A does to it
    ("running",         "FINISH lost"),    # -> queued again, in place, its loss counted
    ("running+spent",   "FINISH lost"),    # -> failed, moved by axa_history_keep
]
# fmt: on


def _cleared(made: list[Subject]) -> None:
    """Delete the rows and workers of a case: the next case of the test starts without them."""
    for s in made:
        Job.objects.filter(pk=s.id).delete()
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM axa_worker WHERE id = %s", [s.worker])
    made.clear()


def _each(cases: list[tuple[str, Callable[[list[Subject]], None]]]) -> None:
    """Run each case, its rows deleted after it; fail naming every case that failed."""
    failed, made = [], []
    for label, case in cases:
        try:
            case(made)
        except Exception as error:  # noqa: BLE001 - each case is judged and named
            failed.append(f"{label}: {type(error).__name__}: {error}")
        finally:
            _cleared(made)
    assert not failed, "\n".join(failed)


def _meets(actors: tuple[Actor, Actor, Actor], setup_conn: psycopg.Connection[Any], row: tuple[Any, ...]) -> Any:
    """Both ends of one row of LOST_MORE, as test_statement_meets_statement runs each."""
    state, a, b, waits, *after = row

    def case(commit: bool, expected: tuple[int, str]) -> Callable[[list[Subject]], None]:
        def run(made: list[Subject]) -> None:
            holder, other, _ = actors
            holder.ready()
            other.ready()
            s = build(setup_conn, state)
            made.append(s)
            start(holder, s, a)
            [ran] = run_into(holder, [(other, MOVES[b])], s, waits, commit)
            found = view(s.id)
            check_invariants([s.id] if found else [], [] if found else [s.id])
            assert (ran.get(), where(found)) == expected

        return run

    label = f"{state}: {a} vs {b}"
    return [(f"{label}, commit", case(True, tuple(after[:2]))), (f"{label}, rollback", case(False, tuple(after[2:])))]


@pytest.mark.parametrize("group", list(LOST_MORE))
def test_more_of_an_attempt_lost_to_the_database_meets_statements(
    actors: tuple[Actor, Actor, Actor], setup_conn: psycopg.Connection[Any], group: str
) -> None:
    _each([case for row in LOST_MORE[group] for case in _meets(actors, setup_conn, row)])


@pytest.mark.parametrize(("state", "a"), LOST_MOVERS, ids=[" ".join(row) for row in LOST_MOVERS])
def test_a_read_or_write_by_id_finds_a_row_an_attempt_lost_to_the_database_moved(
    actors: tuple[Actor, Actor, Actor], setup_conn: psycopg.Connection[Any], state: str, a: str
) -> None:
    holder, other, _ = actors

    def case(b: str, waits: bool | None, commit: bool) -> Callable[[list[Subject]], None]:
        def run(made: list[Subject]) -> None:
            holder.ready()
            other.ready()
            s = build(setup_conn, state)
            made.append(s)
            before = view(s.id)
            assert before is not None
            held = start(holder, s, a)
            [ran] = run_into(holder, [(other, MOVES[b])], s, waits, commit)
            expected = held if commit else before
            row = view(s.id)
            deleted = row is None and (expected is None or b in ("delete", "job.delete", "delete_selected"))
            check_invariants([] if deleted else [s.id], [s.id] if deleted else [])
            check_by_id(b, ran, before, expected, row)

        return run

    _each(
        [
            (f"{state}: {a} vs {b}, {'commit' if commit else 'rollback'}", case(b, waits, commit))
            for b, waits in BY_ID
            for commit in (True, False)
        ]
    )
