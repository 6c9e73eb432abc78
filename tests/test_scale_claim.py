"""The claim under a held snapshot and on any statistics (issue 22): its walk stays put, its plan too."""

from __future__ import annotations

import datetime
import itertools
import os
import re
import signal
import time
import uuid
from types import SimpleNamespace

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from axa_django import Job, dependencies, sql
from axa_django.worker import Worker, connect
from axa_django.worker.lanes import MARGIN, MAX_LANES, Lanes, literal
from axa_django.worker.lookout import Lookout
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

NAME = jobs.add.name
# Finished rows in the plan-stability test; the million with AXA_SCALE_HISTORY=1000000.
HISTORY = int(os.environ.get("AXA_SCALE_HISTORY", "200000"))


def enqueue(conn: psycopg.Connection, count: int, name: str = NAME, priority: int = 0) -> None:
    conn.execute(
        "INSERT INTO axa_queue (id, name, args, priority) "
        'SELECT gen_random_uuid(), %s, \'{"a": 1, "b": 2}\', %s FROM generate_series(1, %s)',
        [name, priority, count],
    )


def naive(when: datetime.datetime) -> datetime.datetime:
    """``when`` as a claim returns run_at: in UTC, without a zone (sql.CLAIM_RUN_AT)."""
    return when.astimezone(datetime.UTC).replace(tzinfo=None)


class Claimer:
    """The worker's plain claim, driven by hand: the same statements and floors (claimlanes.Lanes)."""

    def __init__(self, conn: psycopg.Connection, names: list[str], queues: list[str] | None = None) -> None:
        self.conn, self.names, self.queues = conn, names, queues
        self.lanes = Lanes()
        self.worker = uuid.uuid4()

    def statement(self) -> tuple[str, dict, bool]:
        params = {"worker": self.worker, "limit": 16, "ahead": False}
        self.lanes.serve(self.names)
        if self.lanes.bounded():
            key = self.lanes.key()
            params["floors"] = self.lanes.floors(key)
            return sql.compose(sql.CLAIM_LANES, self.names, [], self.queues, lanes=key), params, True
        return sql.compose(sql.CLAIM_FULL, self.names, [], self.queues), params, False

    def claim(self, limit: int = 16) -> list[tuple]:
        text, params, bounded = self.statement()
        params["limit"] = limit
        rows = self.conn.execute(text, params).fetchall()
        claimed = [row[:12] for row in rows if row[0] is not None]
        snap = next(row[12:] for row in rows if row[0] is None)
        self.lanes.learn(claimed, snap, full=not bounded, exhausted=len(claimed) < limit)
        return claimed

    def wait_bounded(self) -> None:
        """Claim nothing until the next claim may walk from floors.

        A writing transaction older than this claimer's first claim keeps its cap unknown
        (it may still write rows behind any floor): on a server shared with other test
        processes, theirs can.
        """
        wait_for(lambda: self.claim(limit=0) == [] and self.lanes.bounded(), timeout=120, what="a known cap")

    def settle(self) -> None:
        """Wait out every transaction older than now, then claim nothing: the cap is now.

        A writing transaction holds the cap at the last claim before it began while it
        runs (its rows may yet commit behind the floors): one of another test process,
        on a server shared with it, would keep the walk growing for as long as it lasts.
        """
        (now,) = self.conn.execute("SELECT pg_current_xact_id()").fetchone()
        wait_for(
            lambda: self.conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot()) > %s::xid8", [now]).fetchone()[0],
            timeout=120,
            what="the transactions older than now to end",
        )
        assert self.claim(limit=0) == []

    def finish(self, rows: list[tuple]) -> None:
        self.conn.execute(
            "UPDATE axa_queue SET status = 'completed', finished_at = now() WHERE id = ANY(%s)",
            [[row[0] for row in rows]],
        )

    def buffers(self, full: bool = False) -> int:
        text, params, _ = self.statement()
        if full:
            text = sql.compose(sql.CLAIM_FULL, self.names, [], self.queues)
        with self.conn.transaction(force_rollback=True):
            plan = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params).fetchall()
        found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan[1][0]) or re.search(
            r"Buffers: shared hit=(\d+)(?: read=(\d+))?", "\n".join(r[0] for r in plan)
        )
        assert found, plan
        return int(found.group(1)) + int(found.group(2) or 0)


@pytest.fixture
def held():
    """A transaction idle with an old snapshot, as pg_dump holds one: nothing dead can be vacuumed."""
    with connect("default", "snapshot holder") as holder:
        holder.execute("SET idle_in_transaction_session_timeout = 0")  # a worker connection's is half a lease
        holder.commit()
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1 FROM axa_queue LIMIT 1").fetchall()
        yield holder
        holder.rollback()


@pytest.mark.halved
def test_under_a_held_snapshot_the_claims_walk_does_not_grow(held):
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        enqueue(conn, 500)
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim())
        claimer.wait_bounded()
        seen = {}
        for turn in range(1, 801):
            rows = claimer.claim()
            assert len(rows) == 16
            claimer.finish(rows)
            enqueue(conn, 16)
            if turn in (100, 800):
                claimer.settle()
                seen[turn] = (claimer.buffers(), claimer.buffers(full=True))
    (early, early_full), (late, late_full) = seen[100], seen[800]
    print(
        f"claim buffers after 1,600 / 12,800 dead entries: lanes {early} / {late}, full walk {early_full} / {late_full}"
    )
    # Each claim's UPDATE reads a steady couple of hundred buffers; the walks differ. The
    # dead entries are there (a walk from the start reads them all); the lanes' walk does not.
    assert late_full - early_full > 500
    assert late - early < 100
    assert late_full - early_full > 5 * (late - early)


def test_a_row_committed_after_newer_rows_were_claimed_is_claimed_without_a_full_walk(held):
    with connect("default", "test claimer") as conn, connect("default", "late writer") as late:
        conn.autocommit = True
        late.execute("SET idle_in_transaction_session_timeout = 0")
        late.autocommit = False
        claimer = Claimer(conn, [NAME])
        enqueue(conn, 20)
        claimer.claim()
        claimer.wait_bounded()
        # A transaction writes a job (its run_at: this statement's time), then stays open
        # while newer jobs are enqueued and claimed, well past the floor's margin.
        (late_id, run_at) = late.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), %s, '{}') RETURNING id, run_at", [NAME]
        ).fetchone()
        wait_for(
            lambda: conn.execute("SELECT now() - %s > interval '0.3 s'", [run_at]).fetchone()[0],
            what="the late row to be older than the floor's margin",
        )
        taken = set()
        for _ in range(5):
            enqueue(conn, 8)
            rows = claimer.claim()
            taken |= {row[0] for row in rows}
            claimer.finish(rows)
        assert late_id not in taken and claimer.lanes.bounded()
        assert min(claimer.lanes.fronts.values()) > run_at  # the claims went past it
        late.commit()
        rows = claimer.claim(limit=100)
        assert late_id in {row[0] for row in rows}, "the late row was walked past"


def test_a_child_queued_behind_the_floor_is_found_through_its_notification(held):
    with connect("default", "test claimer") as conn, connect("default", "listener") as listener:
        conn.autocommit = True
        listener.autocommit = True
        listener.execute("LISTEN axa_queue")
        parent = jobs.add.perform_later(1, 2)
        child = jobs.add.using(after=[parent]).perform_later(3, 4)
        claimer = Claimer(conn, [NAME])
        rows = claimer.claim()
        assert [row[0] for row in rows] == [parent.pk]
        claimer.wait_bounded()
        for _ in range(3):
            enqueue(conn, 8)
            claimer.finish(claimer.claim())
        # The parent ends; the child (enqueued a minute ago: behind every floor) is queued.
        Job.objects.filter(pk=child.pk).update(run_at=timezone.now() - datetime.timedelta(minutes=1))
        with conn.transaction():
            conn.execute("UPDATE axa_queue SET status = 'completed', finished_at = now() WHERE id = %s", [parent.pk])
            with conn.cursor() as cursor:
                dependencies.settle(cursor, [parent.pk])
        assert Job.objects.get(pk=child.pk).status == "queued"
        assert claimer.lanes.bounded()
        missed = claimer.claim(limit=100)
        assert child.pk not in {row[0] for row in missed}  # behind the floor: a bounded walk misses it
        for row in missed:
            conn.execute("UPDATE axa_queue SET status = 'queued', worker_id = NULL WHERE id = %s", [row[0]])
        payloads = [note.payload for note in listener.notifies(timeout=1) if note.payload.startswith("ready:")]
        assert payloads  # the child's own (a trigger), and the settling's
        for payload in payloads:
            claimer.lanes.heard(payload)
        assert child.pk in {row[0] for row in claimer.claim(limit=100)}


def test_a_worker_under_a_held_snapshot_runs_every_job_once(held, workers, log_file):
    proc = workers.start("--concurrency", "4")
    late = connect("default", "late writer")
    late.execute("SET idle_in_transaction_session_timeout = 0")
    late.commit()
    try:
        late.execute(
            'INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), %s, \'{"a": 0, "b": 0}\')', [NAME]
        )
        first = jobs.add.perform_later_many([{"a": i, "b": 1} for i in range(1, 301)])
        wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in first], status="completed").count() == 300)
        late.commit()
        second = jobs.add.perform_later_many([{"a": i, "b": 2} for i in range(1, 301)])
        wait_for(lambda: Job.objects.filter(status="completed").count() == 601, what="every job, the late one too")
    finally:
        late.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert Job.objects.filter(status="completed", attempts=1).count() == 601
    assert {j.result for j in Job.objects.filter(pk__in=[j.pk for j in second])} == set(range(3, 303))


# -- a plan that stays put ------------------------------------------------------------------


def generic(conn: psycopg.Connection, query: str, params: dict) -> str:
    """EXPLAIN of the plan a worker connection caches for ``query`` (generic: made without its values)."""
    slots: dict[str, str] = {}
    text = re.sub(r"%\((\w+)\)s", lambda m: slots.setdefault(m.group(1), f"${len(slots) + 1}"), query)
    name = f"p{uuid.uuid4().hex[:8]}"
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(psycopg.sql.SQL(f"PREPARE {name} AS ") + psycopg.sql.SQL(text.replace("%%", "%")))
    values = ", ".join(psycopg.sql.Literal(params[key]).as_string(conn) for key in slots)
    rows = conn.execute(psycopg.sql.SQL(f"EXPLAIN EXECUTE {name}({values})")).fetchall()
    return "\n".join(row[0] for row in rows)


def walks_use_claim_indexes(plan: str) -> None:
    scans = [line.strip() for line in plan.splitlines() if re.search(r"Scan.* on axa_queue\b(?! q\b)", line)]
    walks = [line for line in scans if "axa_queue_pkey" not in line]
    assert walks, plan
    for line in walks:
        assert re.search(r"using axa_queue_claim_all(_queue)? ", line), plan
    assert "axa_queue_ready " not in plan and "Seq Scan on axa_queue " not in plan, plan
    # Each walk in order: a Sort under one would read every ready row of a segment. Only a
    # worker of several queues sorts, what the walks of its queues handed on (the LIMIT's worth each).
    sorts = re.findall(r"Sort Key: (.*)", plan)
    assert all(key == "lane.priority DESC, lane.run_at" for key in sorts), plan
    assert "Sort  " not in plan or sorts, plan


def segment_floors(lanes: list[int], floor: str = "2000-01-01T00:00:00+00:00") -> str:
    """%(floors)s for the lane walk over ``lanes``: ``floor`` for each lane, -infinity for each gap."""
    return "{" + ",".join("-infinity" if lane is None else f'"{floor}"' for lane, _, _ in sql.segments(lanes)) + "}"


STATES = ["empty", "history", "skewed"]


@pytest.mark.parametrize("state", STATES)
def test_the_claims_keep_their_plan_whatever_the_statistics(state):
    with connect("default", "planner") as conn:
        conn.autocommit = True
        if state == "history":
            conn.execute(
                "INSERT INTO axa_queue (id, name, args, status, finished_at) "
                "SELECT gen_random_uuid(), %s, '{}', 'completed', now() FROM generate_series(1, %s)",
                [NAME, HISTORY],
            )
            enqueue(conn, 50)
        if state == "skewed":
            enqueue(conn, 30000)
            enqueue(conn, 10, name="other.job", priority=5)
        conn.execute("ANALYZE axa_queue")
        lanes = [5, 0]
        params = {"worker": None, "limit": 16, "ahead": False, "floors": segment_floors(lanes)}
        for queues in (None, ["default"], ["default", "other"]):
            for query in (
                sql.compose(sql.CLAIM_FULL, [NAME, "other.job"], [], queues),
                sql.compose(sql.CLAIM_LANES, [NAME, "other.job"], [], queues, lanes=lanes),
            ):
                plan = generic(conn, query, params)
                walks_use_claim_indexes(plan)
                if queues and state != "empty":
                    assert "axa_queue_claim_all_queue" in plan, plan
                # With nothing queued, axa_queue_claim_all and axa_queue_claim_all_queue cost
                # a --queue worker's walk the same (fresh indexes: which one the planner keeps
                # changed from one test session to the next), or the one with fewer dead
                # entries left behind is cheaper.
    if state != "skewed":
        return
    # The seed's own CLAIM still has its index.
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT id FROM axa_queue WHERE status = 'queued' AND run_at <= now() AND name = ANY(%s) "
            "ORDER BY run_at LIMIT 1",
            [[NAME]],
        )
        assert "axa_queue_ready" in "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.halved
def test_the_claims_keep_their_plan_on_every_small_table():
    """Small tables are where plans tie: a worker caches its generic plan there, then the queue grows."""
    wrong = []
    lanes = [5, 0]
    params = {"worker": None, "limit": 16, "ahead": False, "floors": segment_floors(lanes)}
    with connect("default", "planner") as conn:
        conn.autocommit = True
        grid = itertools.product([0, 5000], ["default", None], [0, 1, 50, 3000], ["default", None], [False, True])
        for finished, finished_backend, queued, queued_backend, emptied in grid:
            conn.execute("DELETE FROM axa_queue")
            conn.execute(
                "INSERT INTO axa_queue (id, name, args, status, backend, finished_at) "
                "SELECT gen_random_uuid(), 'x', '{}', 'completed', %s, now() FROM generate_series(1, %s)",
                [finished_backend, finished],
            )
            conn.execute(
                "INSERT INTO axa_queue (id, name, args, backend) "
                "SELECT gen_random_uuid(), 'x', '{}', %s FROM generate_series(1, %s)",
                [queued_backend, queued],
            )
            conn.execute("ANALYZE axa_queue")
            if emptied:  # an ANALYZE of an emptied table keeps the statistics it had
                conn.execute("TRUNCATE axa_queue CASCADE")
                conn.execute("ANALYZE axa_queue")
            for queues in (None, ["default"]):
                for query in (
                    sql.compose(sql.CLAIM_FULL, [NAME, "other.job"], ["default"], queues),
                    sql.compose(sql.CLAIM_LANES, [NAME, "other.job"], ["default"], queues, lanes=lanes),
                ):
                    plan = generic(conn, query, params)
                    try:
                        walks_use_claim_indexes(plan)
                    except AssertionError:
                        wrong.append((finished, finished_backend, queued, queued_backend, emptied, queues, plan))
    assert not wrong, [case[:-1] for case in wrong] + [wrong[0][-1] if wrong else ""]


def test_an_all_queues_claim_keeps_its_index_on_fresh_indexes_under_statistics_of_many_priorities():
    """Found by CI: statistics left by a queue of 20 priorities, then a TRUNCATE (every index fresh,
    one page each): PostgreSQL 15 walked an all-queues claim over the queue index and sorted it."""
    lanes = [5, 0]
    params = {"worker": None, "limit": 16, "ahead": False, "floors": segment_floors(lanes)}
    with connect("default", "planner") as conn:
        conn.autocommit = True
        conn.execute(
            "INSERT INTO axa_queue (id, name, args, backend, priority) SELECT gen_random_uuid(), 'x', '{}', "
            "CASE WHEN g % 2 = 0 THEN 'default' END, g % 20 FROM generate_series(1, 30000) AS g"
        )
        conn.execute("ANALYZE axa_queue")
        conn.execute("TRUNCATE axa_queue CASCADE")
        conn.execute("ANALYZE axa_queue")  # keeps the column statistics: it sampled no row
        for query in (
            sql.compose(sql.CLAIM_FULL, [NAME, "other.job"], ["default"], None),
            sql.compose(sql.CLAIM_LANES, [NAME, "other.job"], ["default"], None, lanes=lanes),
        ):
            plan = generic(conn, query, params)
            walks_use_claim_indexes(plan)
            assert "axa_queue_claim_all_queue" not in plan, plan


def test_lanes_stay_few_whatever_priorities_a_project_uses():
    with connect("default", "test claimer") as conn:
        conn.autocommit = True
        for priority in range(100):
            enqueue(conn, 1, priority=priority)
        claimer = Claimer(conn, [NAME])
        batches = []
        while rows := claimer.claim():
            batches.append([row[7] for row in rows])
            claimer.finish(rows)
        assert sorted(p for batch in batches for p in batch) == list(range(100))
        assert all(min(a) > max(b) for a, b in itertools.pairwise(batches))  # best first, every claim
        assert len(claimer.lanes.key()) == MAX_LANES
        claimer.wait_bounded()
        enqueue(conn, 1, priority=7)  # a priority past the lanes: walked from its start
        enqueue(conn, 1, priority=99)
        assert claimer.lanes.bounded()
        assert sorted(row[7] for row in claimer.claim()) == [7, 99]


def test_rows_queued_with_a_past_run_at_announce_it_and_others_do_not():
    with connect("default", "listener") as listener, connect("default", "writer") as writer:
        listener.execute("LISTEN axa_queue")
        writer.autocommit = True
        jobs.add.perform_later(1, 2)  # run_at: its statement's time
        enqueue(writer, 3)  # the table's default, as the seed's ENQUEUE
        (old,) = writer.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) VALUES (gen_random_uuid(), %s, '{}', "
            "now() - interval '1 hour') RETURNING id",
            [NAME],
        ).fetchone()
        writer.execute("UPDATE axa_queue SET status = 'failed' WHERE id = %s", [old])
        writer.execute("UPDATE axa_queue SET status = 'queued' WHERE id = %s", [old])  # put back by hand
        writer.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) VALUES (gen_random_uuid(), %s, '{}', '-infinity')", [NAME]
        )
        payloads = [note.payload for note in listener.notifies(timeout=1)]
    ready = [payload for payload in payloads if payload.startswith("ready:")]
    assert len(ready) == 3, payloads  # the insert an hour back, its return to the queue, '-infinity'
    lanes = Lanes()
    now = datetime.datetime.now(datetime.UTC)  # the snapshot's time, as psycopg gives it whatever USE_TZ says
    row = (None, NAME, None, 1, None, None, False, 0, naive(now - datetime.timedelta(seconds=1)))
    lanes.learn([row], (1, 1, now), full=True)
    lanes.heard(ready[0])
    assert lanes.bounded() and lanes.fronts[0] < now - datetime.timedelta(minutes=59)
    lanes.heard(ready[2])  # '-Infinity': walk from the start
    assert not lanes.bounded()


def test_the_floors_hold_for_the_names_they_were_learnt_for_and_a_claim_for_others_walks_in_full():
    lanes = Lanes()
    late = datetime.datetime.now(datetime.UTC)
    early = late - datetime.timedelta(hours=1)
    snap = (1, 1, late + datetime.timedelta(seconds=1))
    lanes.serve(["a", "b"])
    lanes.learn(
        [
            (None, "a", None, 1, None, None, False, 0, naive(early)),
            (None, "b", None, 1, None, None, False, 5, naive(late)),
            (None, "a", None, 1, None, "default", False, 5, naive(early)),  # a django.tasks row: same lane
        ],
        snap,
        full=True,
    )
    key = lanes.key()
    assert key == (5, 0) and lanes.bounded()
    # One floor per segment of the walk, highest priority first; each gap from its start.
    assert lanes.floors(key) == '{-infinity,"' + late.isoformat() + '",-infinity,"' + early.isoformat() + '",-infinity}'
    lanes.serve(["a", "b"])
    assert lanes.bounded()
    lanes.serve(["b"])  # a's rows were never walked for b alone: nothing learnt holds
    assert not lanes.bounded() and lanes.key() == ()
    assert sql.compose(sql.CLAIM_LANES, ["b"], [], None, lanes=lanes.key()).count("'{b}'") >= 1


def test_a_look_after_a_full_walk_was_asked_for_keeps_the_claims_on_their_floors_and_one_before_does_not():
    lanes = Lanes()
    lanes.serve([NAME])
    now = datetime.datetime.now(datetime.UTC)
    at = now + MARGIN + datetime.timedelta(seconds=1)
    lanes.learn([(None, NAME, None, 1, None, None, False, 0, naive(now))], (1, 1, at), full=True)
    assert lanes.bounded() and lanes.shown == ((NAME,), (0,), (None, now, None))
    started = time.monotonic()
    lanes.forget()  # a full walk asked for (an error, a new connection) after that look began
    lanes.looked(None, started, 60.0)
    assert not lanes.bounded()
    lanes.learn([], (1, 1, now), full=True)
    lanes.forget()
    lanes.looked(None, time.monotonic(), 60.0)  # a look that began after: it covers the floors
    assert lanes.bounded()


def test_a_row_behind_the_floors_is_found_by_the_look_while_the_claims_walk_from_their_floors(held):
    with connect("default", "test claimer") as conn, connect("default", "heartbeat") as beat:
        conn.autocommit = True
        enqueue(conn, 20)
        claimer = Claimer(conn, [NAME])
        claimer.finish(claimer.claim())
        claimer.wait_bounded()
        # A row put back behind every floor, with no notification: the seed's REQUEUE_STALE.
        (behind,) = conn.execute(
            "INSERT INTO axa_queue (id, name, args, status, run_at) VALUES (gen_random_uuid(), %s, '{}', 'running', "
            "now() - interval '1 hour') RETURNING id",
            [NAME],
        ).fetchone()
        conn.execute("UPDATE axa_queue SET status = 'queued' WHERE id = %s", [behind])
        lookout = Lookout(SimpleNamespace(backends=[], queues=None), claimer.lanes, interval=10.0)
        claimer.lanes.forget()  # a walk in full is due: a look that begins after it does its work
        assert lookout.due()
        lookout.look(beat, "10s")
        assert not lookout.due()  # FULL_SCAN seconds to the next
        assert claimer.statement()[2], "the claims walk in full though the look has looked"
        taken = {row[0] for row in claimer.claim()}
        assert behind in taken
        claimer.finish(claimer.claim(limit=100))
        assert claimer.lanes.bounded()
        lookout.look(beat, "10s")  # nothing behind the floors now: they stay where the claims put them
        fronts = dict(claimer.lanes.fronts)
        assert claimer.lanes.bounded() and claimer.lanes.fronts == fronts
        # The look walks each lane's claim index up to its floor, like the claims, as a generic plan.
        names, key, shown = claimer.lanes.shown
        floors = literal(shown)
        beat.execute("SET plan_cache_mode = force_generic_plan")
        text = sql.compose(sql.LOOK_BEHIND, list(names), [], None, lanes=key)
        plan = "\n".join(row[0] for row in beat.execute("EXPLAIN " + text, {"floors": floors}))
        assert (
            names == (NAME,)
            and "axa_queue_claim_all " in plan
            and "Seq Scan on axa_queue" not in plan
            and "Sort" not in plan
        ), plan


@pytest.mark.parametrize("burst", [False, True])
def test_the_rescue_runs_after_a_beat_not_between_claims_except_in_a_burst(burst):
    # Under a held snapshot the rescue and the look for unhandled jobs walk dead entries
    # for 0.1-0.9 s: on the dispatcher, no claim could run meanwhile.
    worker = Worker(burst=burst, install_signals=False, concurrency=1)
    on_dispatcher: list[str] = []
    worker.db.bounded = lambda query, params, **_: on_dispatcher.append(query) or []  # type: ignore[method-assign]
    worker.dispatcher.housekeep()
    assert (sql.RESCUE in on_dispatcher) is burst
    after_beat: list[str] = []
    if not burst:
        worker.heartbeat.watchman.watch(lambda query, params, **_: after_beat.append(query) or [])
    assert (sql.RESCUE in after_beat) is not burst
    assert (worker.heartbeat.watchman is None) is burst
