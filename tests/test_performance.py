"""What keeps the queue fast, checked for behaviour (figures live in benchmarks/)."""

import re

import psycopg
import pytest
from django.db import connection, transaction

from axa_django import Job, sql, unhandled
from axa_django.worker import Worker, connect
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import flow_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def explain(query: str, params: dict) -> str:
    with connect("default", "test") as conn:
        conn.execute("ANALYZE axa_queue")
        rows = conn.execute(psycopg.sql.SQL("EXPLAIN ") + psycopg.sql.SQL(query), params).fetchall()
    return "\n".join(row[0] for row in rows)


def fill(finished: int, foreign: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status) SELECT gen_random_uuid(), 'CountWorker', '{}', "
            "'completed' FROM generate_series(1, %s)",
            [finished],
        )
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), 'other.Job', '{}' "
            "FROM generate_series(1, %s)",
            [foreign],
        )


def test_the_claim_uses_the_claim_index_not_a_scan():
    fill(finished=20_000, foreign=5_000)
    jobs.count.perform_later(fail=False)
    plan = explain(sql.compose(sql.CLAIM, ["CountWorker"], [], None), {"worker": None, "limit": 4, "ahead": False})
    assert "axa_queue_claim_all " in plan, plan
    assert "Seq Scan on axa_queue " not in plan, plan  # the table, not axa_queue_limit


def test_the_claim_with_queues_uses_the_per_queue_claim_index():
    fill(finished=20_000, foreign=5_000)
    plan = explain(
        sql.compose(sql.CLAIM, ["CountWorker"], [], ["default"]), {"worker": None, "limit": 4, "ahead": False}
    )
    assert "axa_queue_claim_all_queue" in plan and "Seq Scan on axa_queue " not in plan, plan


def test_the_seeds_ready_index_serves_the_oldest_ready_job():
    fill(finished=20_000, foreign=5_000)
    plan = explain("SELECT id FROM axa_queue WHERE status = 'queued' AND run_at <= now() ORDER BY run_at LIMIT 1", {})
    assert "axa_queue_ready" in plan, plan


def test_claims_and_finishes_write_no_entry_in_the_admins_status_index():
    def size() -> int:
        with connection.cursor() as cursor:
            # axa_queue's, and the history's copy (a finished row moves there: history.py).
            cursor.execute(
                "SELECT sum(pg_relation_size(indexrelid)) FROM pg_index JOIN pg_class c ON c.oid = indexrelid "
                "WHERE c.relname ~ '^axa_(queue|history_[0-9]+)_status$'"
            )
            return cursor.fetchone()[0]

    fill(finished=0, foreign=2_000)
    empty = size()
    Job.objects.filter(name="other.Job").update(status="running")
    Job.objects.filter(name="other.Job").update(status="completed")
    assert size() == empty  # a claim sets running, a finish completed: two entries a job before
    Job.objects.filter(name="other.Job").update(status="failed")
    assert size() > empty  # the rarer statuses are still listed through it


def generic_plan(query: str) -> str:
    """EXPLAIN of the plan a worker connection caches for ``query`` (generic: made without its parameters)."""
    slots: dict[str, str] = {}
    text = re.sub(r"%\((\w+)\)s", lambda m: slots.setdefault(m.group(1), f"${len(slots) + 1}"), query)
    with connect("default", "test") as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(psycopg.sql.SQL("PREPARE claim AS ") + psycopg.sql.SQL(text.replace("%%", "%")))
        nulls = ", ".join("NULL" for _ in slots)
        rows = conn.execute(psycopg.sql.SQL(f"EXPLAIN EXECUTE claim({nulls})")).fetchall()
    return "\n".join(row[0] for row in rows)


def test_claims_find_their_rows_where_they_locked_them_even_when_the_statistics_saw_nothing_queued():
    # Statistics taken while nothing was queued (a quiet queue, most rows finished), then a
    # backlog: with a status test beside the ids, the cached plan walked the whole ready
    # index for the claimed ids, every claim (28 ms instead of 1 with 20,000 queued).
    fill(finished=20_000, foreign=0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE axa_queue")
    jobs.count.perform_later_many([{"fail": False} for _ in range(2_000)])
    flow_jobs.one_per_account.perform_later_many([{"account_id": i} for i in range(2_000)])
    worker = Worker(install_signals=False)
    limits, _ = worker.limited.keyed([flow_jobs.one_per_account.name])
    _, claim_limited = worker.limited.statements("concurrency", limits)
    # Both find their rows where their walks locked them.
    for query in (sql.compose(sql.CLAIM, ["CountWorker"], [], None), claim_limited):
        plan = generic_plan(query)
        target = plan.split("\n")[[i for i, line in enumerate(plan.split("\n")) if " on axa_queue q" in line][-1]]
        assert target.strip().startswith("->  Tid Scan on axa_queue q"), plan


def test_the_finish_finds_its_rows_by_id_whatever_the_statistics_say():
    # Statistics taken with almost nothing running (a queue under a held snapshot, between
    # two autoanalyzes): the generic plan of a finish joined to its outcomes walked the
    # whole primary key as the outer side of its join, 11,000 buffers a finish.
    fill(finished=0, foreign=20_000)
    with connection.cursor() as cursor:
        # What a held snapshot leaves: the rows gone (dead, not vacuumed), a few running.
        cursor.execute("DELETE FROM axa_queue WHERE ctid IN (SELECT ctid FROM axa_queue OFFSET 10)")
        cursor.execute("UPDATE axa_queue SET status = 'running', started_at = now()")
        cursor.execute("ANALYZE axa_queue")
    for query in (sql.FINISH, sql.FINISH_COMPLETED, sql.FINISH_PARENTS):
        lines = generic_plan(query).split("\n")
        scans = [i for i, line in enumerate(lines) if "Index Scan using axa_queue_pkey" in line]
        assert len(scans) == 2, lines  # the delete's and the retry's
        assert all(lines[i + 1].strip().startswith("Index Cond: (id = ") for i in scans), "\n".join(lines)


def listen() -> psycopg.Connection:
    conn = connect("default", "test listener")
    conn.execute("LISTEN axa_queue")
    return conn


def notifications(conn: psycopg.Connection, timeout: float) -> int:
    return sum(1 for _ in conn.notifies(timeout=timeout))


def test_a_committed_enqueue_notifies_once_per_statement_and_a_rollback_not_at_all():
    with listen() as conn:
        jobs.add.perform_later_many([{"a": i} for i in range(50)])
        assert notifications(conn, 1.0) == 1
        with pytest.raises(RuntimeError), transaction.atomic():
            jobs.add.perform_later(1)
            raise RuntimeError
        assert notifications(conn, 0.5) == 0
        with connection.cursor() as cursor:  # any producer: the seed's plain INSERT
            cursor.execute("INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'CountWorker', '{}')")
        assert notifications(conn, 1.0) == 1


def test_an_idle_worker_is_woken_by_notify_long_before_its_poll(workers):
    proc = workers.start("--poll-interval", "60")
    wait_for(lambda: Job.objects.model._meta.apps.get_model("axa_django", "Worker").objects.exists(), what="worker")
    job = jobs.add.perform_later(1)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", timeout=20, what="pickup via NOTIFY")
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_without_notify_the_worker_polls(workers):
    proc = workers.start("--poll-interval", "0.2", env=workers.env(AXA_TEST_NOTIFY="0"))
    job = jobs.add.perform_later(1)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", timeout=20, what="pickup by polling")
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_a_delayed_job_runs_when_due_not_at_the_next_poll(workers):
    import datetime

    proc = workers.start("--poll-interval", "60")
    job = jobs.add.using(delay=datetime.timedelta(seconds=1)).perform_later(1)
    assert Job.objects.get(pk=job.pk).run_at > Job.objects.get(pk=job.pk).created_at
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", timeout=20, what="delayed job")
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_a_worker_process_holds_four_connections_plus_those_its_jobs_use(workers):
    proc = workers.start("--concurrency", "8")
    no_notify = workers.start("--concurrency", "8", env=workers.env(AXA_TEST_NOTIFY="0"))

    def names():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s "
                "AND datname = current_database()",
                ["axa_django %"],
            )
            return sorted(row[0] for row in cursor.fetchall())

    wait_for(lambda: len(names()) == 7, what="worker connections")
    assert names() == (
        ["axa_django dispatcher"] * 2
        + ["axa_django finisher"] * 2
        + ["axa_django heartbeat"] * 2
        + ["axa_django listener"]
    )
    for p in (proc, no_notify):
        p.terminate()
        assert p.wait(timeout=30) == 0


@pytest.mark.django_db(transaction=True)
def test_the_workers_connections_keep_the_claims_generic_plan():
    # PostgreSQL's auto mode plans a prepared statement afresh for its first 5 runs and,
    # on a large table, often for ever after; the worker's connections never re-plan it.
    query = sql.compose(sql.CLAIM, ["tests.nothing_enqueues_this"], [], None)
    with connect("default", "test") as conn:
        for _ in range(12):  # autocommit, as the worker runs it: psycopg prepares it from the 6th run
            assert conn.execute(query, {"worker": None, "limit": 4, "ahead": False}).fetchall() == []
        generic, custom = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%tests.nothing_enqueues_this%'"
        ).fetchone()
    assert (custom, generic) == (0, 7)


def test_the_workers_statements_are_never_jit_compiled():
    # With sequential scans priced out, a plan that still scans a small table (axa_worker
    # in the rescue) costs more than jit_above_cost: compiling it took 30-95 ms on
    # PostgreSQL 15 for a statement of 0.1 ms, at every rescue.
    with connect("default", "test") as conn:
        with conn.transaction(force_rollback=True):  # pg_jit_available() is false while jit is off
            conn.execute("SET LOCAL jit = on")
            available = conn.execute("SELECT pg_jit_available()").fetchone()[0]
        if not available:
            pytest.skip("this server has no JIT (PostgreSQL built without LLVM)")
        statements = {
            "rescue": (sql.RESCUE, {"lease": 30, "stale": 60, "max_losses": 3}),
            "unhandled": (sql.UNHANDLED, unhandled.params(30)),
            "claim": (sql.compose(sql.CLAIM, [jobs.add.name], [], None), {"worker": None, "limit": 4, "ahead": False}),
        }
        compiled = {}
        for name, (query, params) in statements.items():
            with conn.transaction(force_rollback=True):
                (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()
            compiled[name] = (plan[0]["Plan"]["Total Cost"], "JIT" in plan[0])
    assert compiled["rescue"][0] > 100_000, compiled  # above the default jit_above_cost, as on any server
    assert not any(jit for _, jit in compiled.values()), compiled


def test_a_worker_connection_idle_in_a_transaction_is_ended_by_the_server_within_a_lease():
    # As when a link dies between a statement and its COMMIT: the row lock must not outlive the lease.
    job = jobs.add.perform_later(1)
    with connect("default", "test") as stuck, connect("default", "test") as other:
        stuck.execute("BEGIN")
        stuck.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", [job.pk])

        def lockable() -> bool:
            try:
                with other.transaction():
                    other.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE NOWAIT", [job.pk])
                return True
            except psycopg.errors.LockNotAvailable:
                return False

        assert not lockable()
        wait_for(lockable, timeout=30, what="the server to end the idle transaction")
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            stuck.execute("SELECT 1")


def test_runworker_freezes_what_it_loaded_out_of_the_garbage_collector(workers):
    # A full collection walked everything Django and the job modules loaded (50-90 ms with
    # the GIL held, every thread stalled): the pickup tail's outliers.
    job = jobs.frozen_objects.perform_later()
    assert workers.start("--burst").wait(timeout=60) == 0
    job.refresh_from_db()
    assert job.status == "completed" and job.result > 10_000, (job.status, job.result)
