"""The reconcile's edges, from an adversarial review of "a crash or a failover strands no job".

A job whose outcome the database refuses in every form is not run again every minute; the
statements' commit waits for a synchronous standby. (Measured and left: the reconcile walks
axa_queue_running by worker id, about 0.08 us an entry, dead entries of a held snapshot
included; once a minute, after the rescue, and counted as run when cut short.)
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from axa_django import background_job, sql
from axa_django.worker import Worker, connect
from axa_django.worker import watchman as watchman_module
from tests import clusters
from tests.conftest import AXA_APPS, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def _conn() -> psycopg.Connection[Any]:
    return connect("default", "review44")


def _insert_running(conn: psycopg.Connection[Any], worker: uuid.UUID, count: int, name: str = "review44.x") -> None:
    conn.execute(
        """
        INSERT INTO axa_queue (id, name, args, status, worker_id, run_at, started_at, created_at, updated_at, attempts)
        SELECT gen_random_uuid(), %(name)s, '{}'::jsonb, 'running', %(worker)s, now(), now(),
               now() - interval '1 hour', now() - interval '1 hour', 1
        FROM generate_series(1, %(count)s)
        """,
        {"worker": worker, "count": count, "name": name},
    )


def _explain(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> tuple[int, float]:
    plan: Any = None
    try:
        with conn.transaction():
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()[0][0]
            raise psycopg.Rollback()
    except psycopg.Rollback:
        pass
    top = plan["Plan"]

    def total(node: dict[str, Any]) -> int:
        return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)

    return total(top), plan["Execution Time"]


# ---------------------------------------------------------------------------------------------
# 2. An outcome the database refuses in every form (the finisher's _alone: stripped, in place,
#    stripped in place) is dropped from the ledger's pending set, so the row, still running
#    under the live worker, is taken by the next RECONCILE and run again, its attempt given
#    back: a job run over and over with no crash, never reaching max_attempts.

POISON_RUNS: list[float] = []


@background_job(name="review44.poison", max_attempts=1)
def poison() -> None:
    POISON_RUNS.append(time.monotonic())


REFUSE = """
CREATE OR REPLACE FUNCTION review44_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.name = 'review44.poison' AND (TG_OP = 'DELETE' OR NEW.status IN ('completed', 'failed', 'cancelled')) THEN
        RAISE EXCEPTION 'review44: this row may not finish';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER review44_refuse BEFORE UPDATE OR DELETE ON axa_queue FOR EACH ROW EXECUTE FUNCTION review44_refuse();
"""
UNREFUSE = "DROP TRIGGER IF EXISTS review44_refuse ON axa_queue; DROP FUNCTION IF EXISTS review44_refuse();"


def _run_worker(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


@pytest.mark.halved
def test_an_outcome_refused_in_every_form_is_not_run_again_and_again(settings: Any, monkeypatch: Any) -> None:
    settings.AXA_DJANGO = {"LEASE_SECONDS": 1.5}
    monkeypatch.setattr(watchman_module, "RECONCILE_SECONDS", 1.0)  # the minute's cadence, shortened
    POISON_RUNS.clear()
    with _conn() as conn:
        conn.execute(REFUSE)
    try:
        job = poison.perform_later()
        worker = Worker(names=["review44.poison"], install_signals=False, concurrency=1)
        rounds: list[int] = []
        reconcile = watchman_module.Watchman.reconcile

        def counted(self: Any, run: Any) -> None:
            before = self._next_reconcile
            reconcile(self, run)
            if self._next_reconcile != before:
                rounds.append(1)

        monkeypatch.setattr(watchman_module.Watchman, "reconcile", counted)
        thread = _run_worker(worker)
        try:
            # Six "minutes" of reconciles after the refused outcome.
            wait_for(lambda: len(POISON_RUNS) >= 1, what="the poison job run")
            seen = len(rounds)
            wait_for(lambda: len(rounds) >= seen + 6, timeout=60, what="six reconciles after it")
        finally:
            worker.stop()
            thread.join(20)
        with _conn() as conn:
            attempts, errors = conn.execute("SELECT attempts, errors FROM axa_queue WHERE id = %s", [job.id]).fetchone()
        lost = [e for e in errors if e.get("type") == "OutcomeLost"]
        print(f"runs={len(POISON_RUNS)} attempts={attempts} OutcomeLost entries={len(lost)}")
        assert len(POISON_RUNS) == 1, (
            f"a job with max_attempts=1 whose outcome the database refuses ran {len(POISON_RUNS)} times "
            f"on one live worker with no crash (attempts still {attempts}; {len(lost)} OutcomeLost entries)"
        )
    finally:
        with _conn() as conn:
            conn.execute(UNREFUSE)


# ---------------------------------------------------------------------------------------------
# 3. Under synchronous replication the worker's claims and outcomes must wait for the standby:
#    the setting each statement leaves for its own transaction's commit.


@pytest.mark.skipif(clusters.unavailable() is not None, reason=str(clusters.unavailable()))
def test_with_a_synchronous_standby_named_the_statements_commit_waits_for_it() -> None:
    root = clusters.workspace()
    cluster = clusters.Cluster(root, "sync").init().start(synchronous_standby_names="'review44'")
    try:
        with cluster.connect("postgres") as conn:
            assert conn.execute("SHOW synchronous_standby_names").fetchone()[0] == "review44"
            seen = {}
            for label, statement in (("NO_FLUSH", f"SELECT {sql.NO_FLUSH}"),):
                with conn.transaction():
                    conn.execute(statement)
                    seen[label] = conn.execute("SHOW synchronous_commit").fetchone()[0]
                    raise_ = psycopg.Rollback()
                    raise raise_
        print(seen)
        assert seen["NO_FLUSH"] == "on", seen
    finally:
        clusters.remove(root, [cluster])
