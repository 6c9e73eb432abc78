"""Statements prepared at their first run (claims, the finish) meeting DDL, errors, eviction and Django's connection.

The tests after the first came from the adversarial review of that change (branch review-prepare).
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from django.db import connection, connections, transaction

from axa_django import Job, sql
from axa_django.exceptions import PoolerMisconfigured
from axa_django.execution import Outcome, finish
from axa_django.sql import flow as sqlflow
from axa_django.testing import run_jobs
from axa_django.worker import connect
from axa_django.worker.connection import DispatcherConnection
from axa_django.worker.control import Control
from axa_django.worker.ledger import Ledger
from axa_django.worker.options import Options
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import jobs

NAME = "tests.testapp.jobs.add"


def _dispatcher() -> DispatcherConnection:
    db = DispatcherConnection(Options.build(), Control(), Ledger())
    assert db.open_first()
    return db


def _claim(db: DispatcherConnection, statement: str) -> list | None:
    return db.execute(statement, {"worker": None, "limit": 1, "ahead": False}, binary=True, prepare=True)


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("runs", [1, 6])
def test_a_claim_goes_on_after_a_migration_changes_the_type_of_a_column_it_returns(runs: int) -> None:
    # PostgreSQL fails a prepared statement whose result's types changed ("cached plan must
    # not change result type") at every run, and psycopg keeps it: the dispatcher failed for
    # a lease, then the worker stopped (exit 1). Found by the review of the claims prepared
    # at their first run (runs=1; runs=6 failed the same way before, prepared at the 6th).
    statement = sql.compose(sql.CLAIM_FULL, [NAME], [], None)
    db = _dispatcher()
    params = {"worker": None, "limit": 1, "ahead": False}
    try:
        for _ in range(runs):
            assert db.execute(statement, params, binary=True, prepare=True) is not None
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE axa_queue ALTER COLUMN priority TYPE bigint")
        job = jobs.add.perform_later(1, 2)
        deadline = time.monotonic() + 30
        rows = None
        while rows is None and time.monotonic() < deadline:  # one failed run, then a new connection
            rows = db.execute(statement, params, binary=True, prepare=True)
        assert rows is not None, "the claim never worked again"
        assert [(row[0], row[1]) for row in rows if row[0] is not None] == [(job.id, NAME)]
    finally:
        db.close()
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE axa_queue ALTER COLUMN priority TYPE integer")


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_and_the_finisher_prepare_their_statements_at_the_first_run():
    # Left to psycopg's threshold, each worker connection planned a claim and a finish five
    # times before preparing them (3 ms of server CPU each): 32 fresh worker processes
    # planned each 192 times in a drain of 100,000 jobs: about half of what they cost a job above one
    # process (benchmarks/results/pg15-prepare-at-once-ab.txt).
    claim = sql.compose(sql.CLAIM, ["tests.nothing_enqueues_this"], [], None)
    db = _dispatcher()
    try:
        assert db.execute(claim, {"worker": None, "limit": 4, "ahead": False}, binary=True, prepare=True) == []
        # Only the claims: a statement prepared apart from its run lands in two transactions behind
        # a transaction pooler, and the start-up's probe for one then failed instead of finding it.
        assert db.execute("SELECT pg_backend_pid()", {})
        prepared = "SELECT count(*), count(*) FILTER (WHERE statement LIKE '%%UPDATE ONLY axa_queue%%') FROM pg_prepared_statements"
        assert db.execute(prepared, {}) == [(1, 1)]  # the claim, not the probe
    finally:
        db.close()
    with connect("default", "finisher") as conn, conn.cursor() as cursor:
        gone = uuid.uuid4()
        assert finish(
            cursor, [Outcome(id=gone, name="tests.nothing", attempt=1, status="completed", result="null")], None
        ) == {gone}
        prepared = "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%INSERT INTO axa_history%'"
        assert conn.execute(prepared).fetchone() == (1,)


@pytest.mark.django_db(transaction=True)
def test_with_prepared_statements_off_the_worker_prepares_nothing(monkeypatch):
    options = connections["default"].settings_dict.get("OPTIONS", {})
    monkeypatch.setitem(connections["default"].settings_dict, "OPTIONS", {**options, "prepare_threshold": None})
    claim = sql.compose(sql.CLAIM, ["tests.nothing_enqueues_this"], [], None)
    db = _dispatcher()
    try:
        for _ in range(8):
            assert db.execute(claim, {"worker": None, "limit": 4, "ahead": False}, binary=True, prepare=True) == []
        assert db.execute("SELECT count(*) FROM pg_prepared_statements", {}) == [(0,)]
    finally:
        db.close()
    with connect("default", "finisher") as conn, conn.cursor() as cursor:
        for _ in range(8):
            finish(
                cursor,
                [Outcome(id=uuid.uuid4(), name="tests.nothing", attempt=1, status="completed", result="null")],
                None,
            )
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_claims_and_finishes_go_on_through_ddl_that_keeps_their_result_types() -> None:
    # Prepared at the first run, then: a column added (FINISH moves q.* through a CTE), an
    # index dropped and made again, a fillfactor, a new history table: each statement is
    # planned again, by name, and works.
    # The table is the suite's: each change is undone (the fillfactor set to what it is).
    statement = sql.compose(sql.CLAIM_FULL, [NAME], [], None)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT option_value FROM pg_options_to_table((SELECT reloptions FROM pg_class "
            "WHERE oid = 'axa_queue'::regclass)) WHERE option_name = 'fillfactor'"
        )
        (fillfactor,) = cursor.fetchone()
    db = _dispatcher()
    fin = connect("default", "finisher")
    try:
        for step in (
            "ALTER TABLE axa_queue ADD COLUMN review_extra int",
            f"ALTER TABLE axa_queue SET (fillfactor = {int(fillfactor)})",
            "CREATE INDEX review_idx ON axa_queue (name, priority)",
            "DROP INDEX review_idx",
            "ANALYZE axa_queue",
            "ALTER TABLE axa_queue DROP COLUMN review_extra",
        ):
            job = jobs.add.perform_later(1, 2)
            rows = _claim(db, statement)
            assert rows is not None and [row[0] for row in rows if row[0] is not None] == [job.id], step
            with fin.cursor() as cursor:
                outcome = Outcome(id=job.id, name=NAME, attempt=1, status="completed", result="3")
                assert finish(cursor, [outcome], None) == set(), step
            assert Job.objects.get(id=job.id).status == "completed", step
            with connection.cursor() as cursor:
                cursor.execute(step)
        prepared = fin.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        assert prepared >= 1
    finally:
        db.close()
        fin.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS review_idx")
            cursor.execute("ALTER TABLE axa_queue DROP COLUMN IF EXISTS review_extra")
            cursor.execute(f"ALTER TABLE axa_queue SET (fillfactor = {int(fillfactor)})")


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_statement_cut_short_at_its_parse_is_prepared_again_at_its_next_run() -> None:
    # A housekeeping statement (bounded: lock_timeout 1s) whose Parse waits for a lock a
    # migration holds: Parse fails, and the next run must not take it as prepared.
    db = _dispatcher()
    query = "SELECT count(*) FROM ONLY axa_queue WHERE name = %(name)s"
    try:
        with psycopg.connect(**_params(), autocommit=False) as locker:
            locker.execute("LOCK TABLE axa_queue IN ACCESS EXCLUSIVE MODE")
            assert db.bounded(query, {"name": NAME}) is None  # the lock timeout, at Parse
        assert db.bounded(query, {"name": NAME}) == [(0,)]
        assert db.execute(query, {"name": NAME}) == [(0,)]
        # The backend terminated under a prepared claim: the next run reconnects and prepares anew.
        statement = sql.compose(sql.CLAIM_FULL, [NAME], [], None)
        assert _claim(db, statement) is not None
        pid = db.execute("SELECT pg_backend_pid()", {})[0][0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_for(lambda: _claim(db, statement) is not None, what="a claim on a new connection")
        assert db.opened == 2
    finally:
        db.close()


def _params() -> dict:
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    return params


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_more_statements_than_psycopg_keeps_prepared_evict_cleanly_in_and_out_of_transactions() -> None:
    # Past prepared_max (100) distinct texts (names, lane keys), psycopg closes the oldest.
    # Mixed: autocommit claims, bounded() ones (in a transaction), and bounded ones that
    # fail (an aborted transaction, rolled back: psycopg then drops every prepared statement).
    db = _dispatcher()
    try:
        statements = [sql.compose(sql.CLAIM_FULL, [f"tests.review_{i}"], [], None) for i in range(110)]
        for i, statement in enumerate(statements):
            if i % 3 == 0:
                assert db.bounded(statement, {"worker": None, "limit": 1, "ahead": False}) is not None, i
            elif i % 7 == 0:
                assert db.bounded("SELECT 1/0 FROM ONLY axa_queue WHERE name = %(n)s OR true", {"n": str(i)}) is None
            else:
                assert _claim(db, statement) is not None, i
        for statement in statements[:5] + statements[-5:]:  # evicted ones, and cached ones
            assert _claim(db, statement) is not None
        db._failing_since = None
        conn = db.current()
        kept = conn.execute("SELECT count(*) FROM pg_prepared_statements", prepare=False).fetchone()[0]
        assert kept <= conn.prepared_max + 1, kept
        jobs.add.perform_later(1, 2)
        rows = _claim(db, sql.compose(sql.CLAIM_FULL, [NAME], [], None))
        assert rows is not None and len([row for row in rows if row[0] is not None]) == 1
    finally:
        db.close()


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("threshold", [0, 5])
def test_run_jobs_on_a_django_connection_that_prepares_survives_savepoints_rollbacks_and_discard(
    monkeypatch: pytest.MonkeyPatch, threshold: int
) -> None:
    # finish() prepares FINISH at once on the test's own connection when its OPTIONS set a
    # prepare_threshold (with server-side binding; Django's default client-side cursor
    # prepares nothing). A savepoint rolled back, a transaction rolled back, a DISCARD ALL:
    # each must leave psycopg and the server agreeing on what is prepared.
    options = connection.settings_dict.get("OPTIONS", {})
    monkeypatch.setitem(
        connection.settings_dict, "OPTIONS", {**options, "server_side_binding": True, "prepare_threshold": threshold}
    )
    connection.close()
    try:
        done = []
        for round_ in range(3):
            with transaction.atomic():
                job = jobs.add.perform_later(round_, 1)
                assert [a.status for a in run_jobs()] == ["completed"]
                done.append(job.id)
                with connection.cursor() as cursor:  # the path under review was taken: FINISH is prepared
                    cursor.execute(
                        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                        ["%INSERT INTO axa_history%"],
                    )
                    assert cursor.fetchone()[0] == 1
                try:
                    with transaction.atomic():  # a savepoint, rolled back after another FINISH
                        other = jobs.add.perform_later(round_, 2)
                        assert [a.status for a in run_jobs()] == ["completed"]
                        raise RuntimeError("roll back")
                except RuntimeError:
                    pass
                assert not Job.objects.filter(id=other.id).exists()
            try:
                with transaction.atomic():  # a whole transaction rolled back after FINISH
                    jobs.add.perform_later(round_, 3)
                    assert [a.status for a in run_jobs()] == ["completed"]
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
            with connection.cursor() as cursor:
                cursor.execute("DISCARD ALL")  # a user's hook, a pooler's reset
            job = jobs.add.perform_later(round_, 4)
            assert [a.status for a in run_jobs()] == ["completed"]
            done.append(job.id)
        assert connection.connection.prepare_threshold == threshold
        assert Job.objects.filter(id__in=done, status="completed").count() == len(done)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_claim_whose_prepared_statement_vanished_stops_the_worker_naming_the_pooler() -> None:
    # Behind a transaction pooler the start-up's check missed, the claim's prepared statement
    # is not on the backend the next transaction gets: "prepared statement does not exist" at
    # most claims, and the worker never stopped (found with a PgBouncer in transaction mode
    # handing out its servers in turn). The statement dropped on the server stands in for that
    # backend: psycopg still believes it prepared. Once alone is one connection's glitch (the
    # review: a pipeline cut short as psycopg prepared in it): a new connection, no stop.
    claim = sql.compose(sql.CLAIM, ["tests.nothing_enqueues_this"], [], None)
    db = _dispatcher()

    def lose_the_claim() -> None:
        assert _claim(db, claim) == []
        conn = db.current()
        assert conn is not None
        [(name,)] = conn.execute("SELECT name FROM pg_prepared_statements WHERE statement LIKE '%%axa_queue%%'")
        conn.execute(f'DEALLOCATE "{name}"')

    try:
        lose_the_claim()
        assert _claim(db, claim) is None
        assert db.current() is None, "the connection that lost its statement is closed"
        lose_the_claim()  # on a new connection, within a lease
        with pytest.raises(PoolerMisconfigured, match=r"pool_mode = transaction.*TRANSACTION_POOLING"):
            _claim(db, claim)
        assert db.current() is None
    finally:
        db.close()


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_pipeline_cut_short_as_psycopg_prepares_in_it_costs_one_connection_not_the_limited_claims() -> None:
    # The limited claims' fold runs in a pipeline. At the run psycopg prepares at (its 6th), the
    # fold's lock timing out before it had the server skip the Parse while psycopg recorded the
    # name: every later fold failed ("prepared statement does not exist"), and the limited jobs
    # were never claimed again, the worker looking healthy (found by the review). The dispatcher
    # now drops a connection whose statement vanished; the next prepares afresh.
    db = _dispatcher()
    holder = connect("default", "holder")

    def fold() -> None:
        conn = db.current() or (db.execute("SELECT 1", {}) and db.current())
        assert conn is not None
        with conn.pipeline() as pipeline:  # as worker/limited.py runs it
            conn.execute(sqlflow.FOLD_LOCK, {"since": "0"})
            conn.execute(sqlflow.FOLD, {"since": "0"})
            pipeline.sync()

    try:
        for _ in range(5):
            fold()
        with connection.cursor() as cursor:  # a delta to fold: the fold's lock is then waited for
            cursor.execute("INSERT INTO axa_flow_delta (name, key, queued, running) VALUES ('n', 'k', 0, 0)")
        holder.autocommit = False
        holder.execute("SELECT pg_advisory_xact_lock(%s, 0)", [sqlflow.FOLD_NAMESPACE])
        conn = db.current()
        assert conn is not None
        conn.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            fold()
        conn.execute("RESET statement_timeout")
        holder.rollback()
        with pytest.raises(psycopg.errors.InvalidSqlStatementName) as vanished:
            fold()
        db.failed("jobs with concurrency limits", vanished.value)
        assert db.current() is None, "the connection holding the vanished name is dropped"
        for _ in range(7):  # a new connection: prepared afresh at its 6th run, and on
            fold()
    finally:
        db.close()
        holder.close()
