"""Housekeeping under a held snapshot (issue 46): the rescue of dead workers reads only their
entries, and the looks that walk an index range whole are paced (worker/pacing.py).

A snapshot held open (a long pg_dump, a forgotten REPEATABLE READ transaction) keeps every
index entry of every row the queue ran since: the rescue's sweep, the never-due check, the
reconcile and the looks visit them all, at every beat, and their PostgreSQL time grew with
the hold's length (0.1-0.2 s a call after five minutes at 1,000 jobs/s). Here the hold is
real: rows run and finished behind a REPEATABLE READ transaction on another connection.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from axa_django import sql
from axa_django.worker import connect
from axa_django.worker.heartbeat import Heartbeat
from axa_django.worker.lanes import FULL_SCAN
from axa_django.worker.lookout import Lookout
from axa_django.worker.pacing import LONGEST, SHARE, Pace
from axa_django.worker.watchman import Watchman
from tests.conftest import AXA_APPS
from tests.test_claim_walk import drained

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

DEAD_ENTRIES = 20_000
RESCUE_PARAMS = {"lease": 30.0, "stale": 60, "max_losses": 3}


def test_a_pace_keeps_its_cadence_while_cheap_and_spaces_a_slow_look() -> None:
    pace = Pace(10.0, first=0.0)
    assert pace.due(0.0)
    pace.ran(0.0, 0.002)  # 2 ms: cheap, the cadence holds
    assert (pace.next, pace.due(9.9), pace.due(10.0)) == (10.0, False, True)
    pace.ran(10.0, 1.0)  # 1 s: at most SHARE of the time
    assert pace.next == pytest.approx(10.0 + 1.0 / SHARE)
    assert not pace.due(10.0 + 1.0 / SHARE - 1) and pace.due(10.0 + 1.0 / SHARE)
    pace.ran(1000.0, 0.001)  # cheap again: back to its cadence
    assert pace.next == 1010.0
    pace.ran(2000.0, 30.0)  # a lock waited on, or a hold of days: never more than LONGEST
    assert pace.next == 2000.0 + LONGEST


@pytest.fixture
def held() -> Iterator[psycopg.Connection[Any]]:
    """A live worker ran and finished DEAD_ENTRIES jobs while another connection held a snapshot
    taken before them: their entries in axa_queue_running are dead and can be neither removed
    nor marked as such. Yields the connection holding the snapshot."""
    hold = connect("default", "test snapshot holder")
    # A worker connection's idle-in-transaction limit is half a lease; a slow machine's test
    # outlived it and the hold was cut.
    hold.execute("SET idle_in_transaction_session_timeout = 0")
    hold.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    hold.execute("SELECT count(*) FROM axa_worker").fetchone()  # the snapshot is taken here
    live = uuid.uuid4()
    with connect("default", "test setup") as conn:
        register(conn, live, heartbeat="now()")
        conn.execute(
            "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts) "
            "SELECT gen_random_uuid(), 'held.job', '{}', 'running', %s, now(), 1 FROM generate_series(1, %s)",
            [live, DEAD_ENTRIES],
        )
        # Finished: moved into the history, as the finisher moves them.
        conn.execute("UPDATE ONLY axa_queue SET status = 'completed', finished_at = now() WHERE name = 'held.job'")
        assert conn.execute("SELECT count(*) FROM ONLY axa_queue WHERE name = 'held.job'").fetchone() == (0,)
    try:
        yield hold
    finally:
        hold.rollback()
        hold.close()


def register(conn: psycopg.Connection[Any], worker: uuid.UUID, *, heartbeat: str) -> None:
    conn.execute(
        "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at, "
        f"lease_seconds) VALUES (%s, 'test', 1, 1, '[]', '[]', '[]', now(), {heartbeat}, 30)",
        [worker],
    )


def running_under(conn: psycopg.Connection[Any], worker: uuid.UUID | None, count: int, **extra: str) -> list[Any]:
    started = extra.get("started", "now()")
    return [
        row[0]
        for row in conn.execute(
            "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts) "
            f"SELECT gen_random_uuid(), 'held.other', '{{}}', 'running', %s, {started}, 1 "
            "FROM generate_series(1, %s) RETURNING id",
            [worker, count],
        ).fetchall()
    ]


def buffers(plan: dict[str, Any]) -> int:
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def explained(conn: psycopg.Connection[Any], statement: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of ``statement``, its writes rolled back."""
    with conn.transaction(force_rollback=True):
        [(plan,)] = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", RESCUE_PARAMS).fetchall()
    return plan[0]


@pytest.fixture
def stale_statistics() -> None:
    """Statistics of axa_queue taken when one worker ran 100,000 rows, then the table emptied (as
    a drained queue leaves them; CI's order left them from an earlier test): the planner sees a
    small table, while the held snapshot keeps every dead row of the fixture's."""
    with connect("default", "test statistics") as conn:
        conn.execute(
            "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts) "
            "SELECT gen_random_uuid(), 'stats.job', '{}', 'running', %s, now(), 1 FROM generate_series(1, 100000)",
            [uuid.uuid4()],
        )
        conn.execute("ANALYZE axa_queue")
        conn.execute("TRUNCATE axa_queue CASCADE")


@pytest.mark.usefixtures("stale_statistics")
def test_the_rescue_between_sweeps_reads_only_the_dead_workers_entries(held: psycopg.Connection[Any]) -> None:
    dead, gone = uuid.uuid4(), uuid.uuid4()
    with connect("default", "test rescuer") as conn:
        register(conn, dead, heartbeat="now() - interval '1 hour'")
        lost = running_under(conn, dead, 3)
        orphan = running_under(conn, gone, 1)  # its worker unregistered: the sweep's
        seed = running_under(conn, None, 1, started="now() - interval '2 hours'")  # the seed's, stale: the sweep's
        sweep, between = explained(conn, sql.RESCUE), explained(conn, sql.RESCUE_DEAD)
        print(f"buffers: RESCUE {buffers(sweep['Plan'])}, RESCUE_DEAD {buffers(between['Plan'])}")
        # The sweep visits every dead entry (their heap pages, in order here); the rescue
        # between sweeps only the dead worker's (741 buffers against 75 on PostgreSQL 15).
        assert buffers(sweep["Plan"]) > 5 * buffers(between["Plan"]), between
        taken = conn.execute(sql.RESCUE_DEAD, RESCUE_PARAMS).fetchall()
        assert sorted(taken) == sorted((job_id, "queued") for job_id in lost)
        assert conn.execute("SELECT count(*) FROM axa_worker WHERE id = %s", [dead]).fetchone() == (0,)
        # Left for the sweep, which takes them.
        assert sorted(conn.execute(sql.RESCUE, RESCUE_PARAMS).fetchall()) == sorted(
            (job_id, "queued") for job_id in orphan + seed
        )


def recorded(conn: psycopg.Connection[Any], ran: list[str]) -> Any:
    """The heartbeat's runner of housekeeping statements, noting which ran."""
    names = {
        sql.RESCUE: "RESCUE",
        sql.RESCUE_DEAD: "RESCUE_DEAD",
        sql.FAIL_NEVER_DUE: "FAIL_NEVER_DUE",
        sql.RECONCILE: "RECONCILE",
    }
    real = functools.partial(Heartbeat._run, None, conn)  # type: ignore[arg-type]

    def run(statement: str, params: dict[str, Any], **flags: Any) -> Any:
        ran.append(names.get(statement, "other"))
        return real(time.monotonic() + 30, statement, params, **flags)

    return run


def test_a_slow_sweep_is_spaced_out_and_a_dead_worker_is_rescued_at_the_next_beat_anyway(
    held: psycopg.Connection[Any],
) -> None:
    options = SimpleNamespace(lease=30.0, stale_minutes=60, housekeeping_interval=0.2)
    watchman = Watchman(options)  # type: ignore[arg-type]
    with connect("default", "test heartbeat") as conn:
        ran: list[str] = []
        run = recorded(conn, ran)
        started = time.monotonic()
        watchman.rescue(run)  # the first: a sweep, and the never-due check
        took = watchman._sweep.last
        assert ran[:2] == ["RESCUE", "FAIL_NEVER_DUE"]
        # The walk of DEAD_ENTRIES dead entries took milliseconds: at most SHARE of the time.
        assert took > 0.2 * SHARE, "the sweep was too quick for this test to show its pace"
        assert watchman._sweep.next == pytest.approx(started + max(0.2, took / SHARE), abs=0.05)
        dead = uuid.uuid4()
        register(conn, dead, heartbeat="now() - interval '1 hour'")
        [job] = running_under(conn, dead, 1)
        ran.clear()
        watchman.rescue(run)  # the next beat, before the sweep is due again
        assert ran[0] == "RESCUE_DEAD", ran
        state = conn.execute("SELECT status, worker_id FROM ONLY axa_queue WHERE id = %s", [job]).fetchone()
        assert state == ("queued", None)
        if watchman._never_due.next > time.monotonic():
            assert "FAIL_NEVER_DUE" not in ran


def test_the_reconcile_of_the_minute_is_paced_and_the_rounds_after_a_reconnect_are_not(
    held: psycopg.Connection[Any],
) -> None:
    options = SimpleNamespace(lease=30.0, stale_minutes=60, housekeeping_interval=10.0)
    worker = uuid.uuid4()
    ledger = SimpleNamespace(owned=lambda: [])
    watchman = Watchman(options, worker, ledger)  # type: ignore[arg-type]
    with connect("default", "test heartbeat") as conn:
        ran: list[str] = []
        run = recorded(conn, ran)
        watchman._reconcile_rounds = 0
        watchman._next_reconcile = 0.0  # the minute's round is due
        before = time.monotonic()
        watchman.reconcile(run)
        assert ran == ["RECONCILE"]
        # A minute, or more when it was slow: at most SHARE of the time.
        took = watchman._reconcile_pace.last
        assert took > 0
        assert watchman._next_reconcile == pytest.approx(before + max(60.0, took / SHARE), abs=0.05)
        watchman._reconcile_rounds = 2  # a reconnect: its rounds run at once, paced or not
        watchman.reconcile(run)
        assert ran == ["RECONCILE", "RECONCILE"]


def test_the_rescue_and_a_cheap_sweep_run_at_every_beat_whatever_each_beat_took() -> None:
    """24 beats an interval apart (from each beat's start, as Heartbeat.loop spaces them), each
    followed by watch(): a rescue at every one, and a cheap sweep at every one. Timed from its
    own start, a watch after a beat quicker than the one before skipped a whole interval (review:
    19-22 rescues in 24 beats)."""
    interval = 0.5
    options = SimpleNamespace(lease=3 * interval, stale_minutes=60, housekeeping_interval=interval)
    watchman = Watchman(options)  # type: ignore[arg-type]
    pause = threading.Event()
    with connect("default", "test heartbeat") as conn:
        conn.autocommit = True
        ran: list[str] = []
        run = recorded(conn, ran)
        rescues: list[str] = []
        due = time.monotonic()
        for beat in range(24):
            pause.wait(max(0.0, due - time.monotonic()))
            began = time.monotonic()
            # The beat itself, of varying length.
            conn.execute("SELECT pg_sleep(%s)", [0.02 * (beat % 3)]).fetchone()
            due = began + interval
            ran.clear()
            cheap = watchman._sweep.gap() == interval
            watchman.watch(run)
            rescue = [name for name in ran if name in ("RESCUE", "RESCUE_DEAD")]
            rescues += rescue
            assert not (cheap and rescue == ["RESCUE_DEAD"]), f"beat {beat}: the cheap sweep was not due"
    assert len(rescues) == 24, rescues


def test_a_look_behind_the_floors_covers_them_until_the_next_look_and_one_more() -> None:
    with connect("default", "test claimer") as conn, connect("default", "test heartbeat") as beat:
        conn.autocommit = True
        claimer = drained(conn, 3)
        assert claimer.claim(limit=100) == []  # idle: the floors shown
        lookout = Lookout(SimpleNamespace(backends=[], queues=None), claimer.lanes, interval=10.0)  # type: ignore[arg-type]
        assert lookout.due()
        lookout.look(beat, "10s")
        # Cheap: as before the pace, a minute (the next look in 30 s, and one missed).
        assert (lookout._pace.gap(), lookout.valid) == (FULL_SCAN, 2 * FULL_SCAN)
        assert not lookout.due()
        # However slow a look was, the floors are trusted at most LONGEST and one look more.
        lookout._pace.ran(0.0, 3600.0)
        assert lookout._pace.gap() + max(FULL_SCAN, 10.0) == LONGEST + FULL_SCAN
