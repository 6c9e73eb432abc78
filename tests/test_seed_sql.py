"""The Rust crate's four statements, verbatim, against the migrated table."""

import re
import uuid

import pytest
from django.db import connection

from axa_django import Job
from axa_django.worker import connect
from tests.conftest import AXA_APPS, ROOT

# The wire contract with axa's queue module (shared/seed/axa_queue.rs), byte for byte.
ENQUEUE = "INSERT INTO axa_queue (id, name, args) VALUES ($1, $2, $3)"
CLAIM = """UPDATE axa_queue
    SET status = 'running', started_at = now(), updated_at = now()
    WHERE id = (
        SELECT id FROM axa_queue
        WHERE status = 'queued' AND run_at <= now() AND name = ANY($1)
        ORDER BY run_at
        FOR UPDATE SKIP LOCKED
        LIMIT 1
    )
    RETURNING id, name, args"""
FINISH = "UPDATE axa_queue SET status = $2, error = $3, updated_at = now() WHERE id = $1"
REQUEUE_STALE = """UPDATE axa_queue
    SET status = 'queued', started_at = NULL, updated_at = now()
    WHERE status = 'running' AND started_at < now() - make_interval(mins => $1)"""

SEED = ROOT.parent / "shared" / "seed" / "axa_queue.rs"

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def seed_statement(source: str, name: str) -> str:
    match = re.search(rf'const {name}: &str =\s*"(.*?)";', source, re.S)
    assert match, name
    return match.group(1)


@pytest.mark.skipif(not SEED.exists(), reason="shared/seed/axa_queue.rs is not beside this checkout")
def test_statements_here_are_the_seeds_verbatim():
    source = SEED.read_text()
    for name, text in [("ENQUEUE", ENQUEUE), ("CLAIM", CLAIM), ("FINISH", FINISH), ("REQUEUE_STALE", REQUEUE_STALE)]:
        assert seed_statement(source, name) == text, name


def run(sql: str, *params: str | None) -> list[tuple]:
    """Execute with libpq's own $n parameters, as sqlx does."""
    with connect("default", "seed test") as conn:
        result = conn.pgconn.exec_params(sql.encode(), [None if p is None else p.encode() for p in params])
        assert result.status in (1, 2), result.error_message.decode()  # COMMAND_OK or TUPLES_OK
        return [
            tuple(
                None if result.get_value(r, c) is None else result.get_value(r, c).decode()
                for c in range(result.nfields)
            )
            for r in range(result.ntuples)
        ]


def test_seed_enqueue_claim_finish_and_requeue_run_unchanged():
    job_id = str(uuid.uuid4())
    run(ENQUEUE, job_id, "CountWorker", '{"fail": false}')
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.queue, row.priority, row.attempts, row.errors) == ("queued", "default", 0, 0, [])

    claimed = run(CLAIM, "{CountWorker}")
    assert claimed == [(job_id, "CountWorker", '{"fail": false}')]
    assert Job.objects.get(pk=job_id).status == "running"

    run(FINISH, job_id, "failed", "boom")
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.error) == ("failed", "boom")

    Job.objects.filter(pk=job_id).update(status="running")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET started_at = now() - interval '2 hours' WHERE id = %s", [job_id])
    run(REQUEUE_STALE, "60")
    assert Job.objects.get(pk=job_id).status == "queued"


def test_a_row_enqueued_by_the_seed_is_run_by_runworker(workers):
    job_id = str(uuid.uuid4())
    run(ENQUEUE, job_id, "CountWorker", '{"fail": false}')
    proc = workers.start("--burst")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.attempts) == ("completed", 1)


def test_a_job_enqueued_here_is_claimed_by_the_seeds_claim():
    from tests.testapp import jobs

    job = jobs.count.perform_later(fail=True)
    assert run(CLAIM, "{CountWorker}") == [(str(job.pk), "CountWorker", '{"fail": true}')]


def test_a_row_claimed_by_the_seed_is_rescued_by_the_stale_rule_not_the_lease():
    from axa_django.worker import Worker

    job_id = str(uuid.uuid4())
    run(ENQUEUE, job_id, "CountWorker", '{"fail": false}')
    run(CLAIM, "{CountWorker}")
    # Running for a minute, far past LEASE_SECONDS but inside STALE_MINUTES: left alone.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET started_at = now() - interval '1 minute' WHERE id = %s", [job_id])
    Worker(burst=True, install_signals=False).run()
    assert Job.objects.get(pk=job_id).status == "running"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET started_at = now() - interval '61 minutes' WHERE id = %s", [job_id])
    Worker(burst=True, install_signals=False).run()
    assert Job.objects.get(pk=job_id).status == "completed"


def test_storage_parameters_and_indexes_are_in_place():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'axa_queue'")
        options = cursor.fetchone()[0]
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'axa_queue' AND indexname = 'axa_queue_ready'"
        )
        ready = cursor.fetchone()[0]
    assert "fillfactor=70" in options and "autovacuum_vacuum_scale_factor=0.01" in options
    assert ready.endswith("(run_at) WHERE (status = 'queued'::text)")


def test_the_seeds_requeue_stale_spares_a_live_workers_job_and_takes_a_dead_ones(workers):
    """A mixed fleet keeps the liveness promise: the seed's REQUEUE_STALE, run verbatim by a
    Rust service at its start, leaves a job whose Django worker beats (however long it has
    run) and requeues it once that worker is dead (its heartbeat older than its lease)."""
    import signal

    from axa_django import conf
    from tests.conftest import wait_for
    from tests.testapp import jobs

    proc = workers.start("--concurrency", "1")
    job = jobs.slow.perform_later(120)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", what="the job running")
    owner = Job.objects.get(pk=job.pk).worker_id
    assert owner is not None
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET started_at = now() - interval '2 hours' WHERE id = %s", [job.pk])
    run(REQUEUE_STALE, "60")
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker_id) == ("running", owner)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    lease = float(conf.get("LEASE_SECONDS"))

    def stale() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT heartbeat_at < now() - make_interval(secs => %s) FROM axa_worker WHERE id = %s",
                [lease, row.worker_id],
            )
            found = cursor.fetchone()
        return found is None or bool(found[0])

    wait_for(stale, timeout=lease * 4, what="the killed worker's heartbeat older than its lease")
    run(REQUEUE_STALE, "60")
    assert Job.objects.get(pk=job.pk).status == "queued"


@pytest.mark.parametrize("lease", ["1e12", "'Infinity'", "'NaN'", "-1"])
def test_the_seeds_requeue_stale_runs_whatever_lease_a_worker_row_holds(lease):
    # Review: axa_queue_requeue read now() - make_interval(secs => lease_seconds); a lease
    # written by hand as 1e12, Infinity or NaN failed the seed's whole REQUEUE_STALE.
    worker = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, heartbeat_at, lease_seconds) "
            f"VALUES (%s, 'by hand', 1, 1, '[]', now(), {lease})",
            [worker],
        )
        ids = {}
        for key, owner in (("kept", worker), ("seed", None)):
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts) "
                "VALUES (gen_random_uuid(), 'seed.job', '{}', 'running', %s, now() - interval '2 hours', 1) "
                "RETURNING id",
                [owner],
            )
            ids[key] = cursor.fetchone()[0]
    run(REQUEUE_STALE, "60")
    live = lease != "-1"  # a negative lease is no lease: the worker counts as gone
    assert Job.objects.get(pk=ids["kept"]).status == ("running" if live else "queued")
    assert Job.objects.get(pk=ids["seed"]).status == "queued"
