"""Pruning finished jobs: durations, filters, batches under any plan, RETENTION, beside a busy worker."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction

from axa_django import Job, housekeeping, pruning
from tests.conftest import ROOT, Workers, wait_for
from tests.test_cron import Housekeeper, finishes, held
from tests.testapp import jobs

NAME = "tests.testapp.jobs.add"


def insert_rows(count: int, status: str = "completed", age: str = "30 days", run_at: str = "now()") -> None:
    """Bulk-insert ``count`` rows of ``status`` created and last changed ``age`` ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, created_at, updated_at, finished_at, run_at) "
            "SELECT gen_random_uuid(), %s, '{\"a\": 1}'::jsonb, %s, now() - %s::interval, now() - %s::interval, "
            f"CASE WHEN %s IN ('completed', 'failed', 'cancelled') THEN now() - %s::interval END, {run_at} "
            "FROM generate_series(1, %s)",
            [NAME, status, age, age, status, age, count],
        )


def by_status() -> dict[str, int]:
    return {s: Job.objects.filter(status=s).count() for s in Job.Status.values if Job.objects.filter(status=s).exists()}


def test_parse_duration() -> None:
    assert pruning.parse_duration("30s") == datetime.timedelta(seconds=30)
    assert pruning.parse_duration("15m") == datetime.timedelta(minutes=15)
    assert pruning.parse_duration("12h") == datetime.timedelta(hours=12)
    assert pruning.parse_duration("7d") == datetime.timedelta(days=7)
    assert pruning.parse_duration("2w") == datetime.timedelta(days=14)
    for text in ("30s", "15m", "12h", "7d", "90m"):
        assert pruning.format_duration(pruning.parse_duration(text)) == text
    for bad in ("7", "7x", "-1d", "0s", "1.5h", "d", "", "7 days"):
        with pytest.raises(ValueError, match="expected a positive duration such as 30s"):
            pruning.parse_duration(bad)


@pytest.mark.django_db
def test_prunejobs_rejects_bad_options_clearly() -> None:
    with pytest.raises(CommandError, match=r"--older-than.*expected a positive duration such as 30s, 15m"):
        call_command("prunejobs", "--older-than", "7 days")
    with pytest.raises(CommandError, match=r"--status.*invalid choice: 'queued'"):
        call_command("prunejobs", "--older-than", "7d", "--status", "queued")
    with pytest.raises(CommandError, match="the following arguments are required: --older-than"):
        call_command("prunejobs")


@pytest.mark.django_db
def test_dry_run_counts_and_deletes_nothing() -> None:
    insert_rows(5, "completed")
    insert_rows(3, "failed")
    insert_rows(2, "completed", age="1 day")
    out = StringIO()
    call_command("prunejobs", "--older-than", "7d", "--dry-run", stdout=out)
    assert out.getvalue() == "would delete 8 cancelled/completed/failed jobs older than 7d\n"
    assert Job.objects.count() == 10


@pytest.mark.django_db(transaction=True)
def test_status_filter_and_age_and_unfinished_jobs_are_kept() -> None:
    insert_rows(5, "completed")
    insert_rows(4, "failed")
    insert_rows(3, "cancelled")
    insert_rows(2, "failed", age="1 hour")
    insert_rows(2, "queued", run_at="now() + interval '1 day'")
    insert_rows(1, "running")

    out = StringIO()
    call_command("prunejobs", "--older-than", "2h", "--status", "failed", "--status", "cancelled", stdout=out)
    assert out.getvalue().splitlines()[-1] == "deleted 7 cancelled/failed jobs older than 2h"
    assert by_status() == {"queued": 2, "running": 1, "completed": 5, "failed": 2}

    call_command("prunejobs", "--older-than", "15m", stdout=StringIO())
    assert by_status() == {"queued": 2, "running": 1}


@pytest.mark.django_db(transaction=True)
def test_prunejobs_deletes_in_batches_and_prints_progress(workers: Workers) -> None:
    insert_rows(250)
    done = workers.manage("prunejobs", "--older-than", "7d", "--batch-size", "100")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "deleted 100 (total 100)",
        "deleted 100 (total 200)",
        "deleted 50 (total 250)",
        "deleted 250 cancelled/completed/failed jobs older than 7d",
    ]
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_prune_refuses_to_run_in_one_transaction() -> None:
    # pytest-django wraps this test in a transaction, as a caller's atomic() would.
    with pytest.raises(RuntimeError, match="one transaction per batch"):
        pruning.prune(datetime.timedelta(days=7))


# Planner settings that make PostgreSQL choose a nested loop over every join it can:
# with ``id IN (SELECT ... LIMIT n)`` the subquery becomes the rescanned inner side.
NESTED_LOOPS = ("hashjoin", "mergejoin")
EVERY_NESTED_LOOP = (*NESTED_LOOPS, "hashagg", "material", "sort", "indexscan", "bitmapscan")


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def batch_params(batch_size: int) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() - interval '7 days'")
        return {"statuses": list(pruning.FINISHED), "limit": batch_size, "cutoff": cursor.fetchone()[0], "skip": []}


@pytest.mark.parametrize("disabled", [NESTED_LOOPS, EVERY_NESTED_LOOP], ids=["no-hash-merge", "every-nested-loop"])
@pytest.mark.django_db
def test_one_batch_deletes_at_most_its_limit_under_any_plan(disabled: tuple[str, ...]) -> None:
    insert_rows(20_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE axa_queue")
        for setting in disabled:  # SET LOCAL: undone with the test's transaction
            cursor.execute(f"SET LOCAL enable_{setting} = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + pruning.DELETE_BATCH, batch_params(500))
        [[explained]] = cursor.fetchall()
    # Django's psycopg setup may hand json back as text.
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]

    # The row-locking LIMIT runs once, as an InitPlan of the DELETE, never inside a join.
    nodes = list(plan_nodes(plan))
    assert not [n["Node Type"] for n in nodes if "Join Type" in n], plan
    [init_plan] = [n for n in nodes if n.get("Parent Relationship") == "InitPlan"]
    assert [n["Node Type"] for n in plan_nodes(init_plan)][:2] == ["Limit", "LockRows"], plan

    assert pruning.prune_batch(datetime.timedelta(days=7), batch_size=500) == 500
    assert Job.objects.count() == 20_000 - 500


@pytest.mark.django_db(transaction=True)
def test_prunejobs_batches_hold_under_forced_nested_loops() -> None:
    insert_rows(2_500)
    options = " ".join(f"-c enable_{setting}=off" for setting in EVERY_NESTED_LOOP)
    done = subprocess.run(
        [sys.executable, "-m", "django", "prunejobs", "--older-than", "7d", "--batch-size", "500"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=Workers().env(PGOPTIONS=options),  # libpq sends these with every connection
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        *(f"deleted 500 (total {total})" for total in range(500, 2_501, 500)),
        "deleted 2500 cancelled/completed/failed jobs older than 7d",
    ]


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_draining_while_a_prune_runs(workers: Workers) -> None:
    insert_rows(20_000)
    workers.start("--concurrency", "4")
    drained = jobs.add.perform_later_many([{"a": i, "b": 1} for i in range(300)])
    # Every other batch, the pruner waits for the worker to run a job enqueued right then:
    # the prune cannot finish unless the worker keeps going while it runs.
    probes: list[Job] = []

    def progress(deleted: int, total: int) -> None:
        if deleted and total % 4_000 == 0:
            probe = jobs.add.perform_later(total, b=0)
            probes.append(probe)
            wait_for(lambda: Job.objects.get(pk=probe.pk).status == "completed", what=f"a job at {total} pruned")

    deleted = pruning.prune(datetime.timedelta(days=7), batch_size=2_000, progress=progress)

    assert deleted == 20_000
    assert len(probes) == 5
    week_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=7)
    assert Job.objects.filter(created_at__lt=week_ago).count() == 0
    wait_for(
        lambda: Job.objects.filter(id__in=[j.id for j in drained], status="completed").count() == 300,
        what="the worker drained its 300 jobs",
    )
    assert Job.objects.count() == 300 + len(probes)
    assert Job.objects.get(pk=probes[-1].pk).result == probes[-1].args["a"]


@pytest.mark.django_db(transaction=True)
def test_an_open_prune_batch_does_not_block_the_worker(workers: Workers) -> None:
    insert_rows(20_000)
    workers.start("--concurrency", "2")
    in_batch = threading.Event()
    release = threading.Event()
    deleted: list[int] = []

    def hold_a_batch() -> None:
        try:
            with transaction.atomic():
                deleted.append(pruning.prune_batch(datetime.timedelta(days=7)))
                in_batch.set()
                release.wait(timeout=60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_a_batch)
    thread.start()
    try:
        assert in_batch.wait(timeout=60)
        job = jobs.add.perform_later(4, b=5)
        done = wait_for(lambda: (j := Job.objects.get(pk=job.pk)).status == "completed" and j, what="the job done")
        assert done.result == 9
        assert Job.objects.filter(status="completed").count() == 20_001  # the batch is not committed yet
    finally:
        release.set()
        thread.join(timeout=60)
    assert deleted == [pruning.BATCH_SIZE]
    assert Job.objects.filter(status="completed").count() == 20_001 - pruning.BATCH_SIZE


@pytest.mark.django_db(transaction=True)
def test_workers_prune_one_batch_per_housekeeping_with_retention(settings: Any) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    insert_rows(housekeeping.RETENTION_BATCH + 10, "completed", age="2 hours")
    insert_rows(3, "completed", age="10 minutes")
    insert_rows(2, "queued", age="2 hours", run_at="now() + interval '1 day'")
    from axa_django.worker import Worker

    # A burst worker with nothing to run housekeeps exactly once.
    assert Worker(burst=True, install_signals=False).run() == 0

    assert by_status() == {"completed": 10 + 3, "queued": 2}
    assert Worker(burst=True, install_signals=False).run() == 0
    assert by_status() == {"completed": 3, "queued": 2}


def started_line(proc: subprocess.Popen[str], pattern: str, lines: list[str]) -> None:
    """Read the worker's output into ``lines`` until a line holds ``pattern``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if pattern in line:
            return
    raise AssertionError("the worker exited without saying " + repr(pattern) + ":\n" + "".join(lines))


@pytest.mark.django_db(transaction=True)
def test_a_worker_prunes_until_caught_up_in_its_maintenance_thread() -> None:
    # One batch a housekeeping (every lease/3) pruned 200 rows/s at the defaults: less
    # than a busy queue finishes. A round now deletes batch after batch.
    total = 3 * housekeeping.RETENTION_BATCH + 10
    insert_rows(total, "completed", age="2 hours")
    insert_rows(3, "completed", age="10 minutes")
    workers = Workers()
    proc = workers.start("--concurrency", "1", env=workers.env(AXA_TEST_RETENTION="3600", AXA_LOG_LEVEL="INFO"))
    lines: list[str] = []
    try:
        started_line(proc, "pruned", lines)
        assert f"pruned {total} finished job(s) older than RETENTION" in lines[-1], "".join(lines)
        assert by_status() == {"completed": 3}
    finally:
        workers.close()


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_a_slow_prune_does_not_hold_up_the_claims() -> None:
    insert_rows(10, "completed", age="2 hours")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION axa_test_stall() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$"
        )
        # Rows only, finished ones: the worker's FINISH deletes running rows (into the history).
        cursor.execute(
            "CREATE TRIGGER axa_test_stall BEFORE DELETE ON axa_queue FOR EACH ROW WHEN (OLD.status <> 'running') "
            "EXECUTE FUNCTION axa_test_stall()"
        )
    workers = Workers()
    try:
        workers.start("--concurrency", "1", env=workers.env(AXA_TEST_RETENTION="3600"))

        def pruning() -> Any:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid, query_start FROM pg_stat_activity WHERE state = 'active' "
                    "AND datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
                    ["%DELETE FROM ONLY axa_queue WHERE id = ANY%"],
                )
                return cursor.fetchone()

        stalled = wait_for(pruning, what="the worker's prune to stall in the trigger")
        job = jobs.add.perform_later(2, b=3)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="the job done")
        # Done while the prune statement still runs (its statement timeout is 5 s): the
        # dispatcher did not wait for it.
        assert pruning() == stalled
    finally:
        workers.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS axa_test_stall ON axa_queue")
            cursor.execute("DROP FUNCTION IF EXISTS axa_test_stall()")


@pytest.mark.django_db(transaction=True)
def test_workers_do_not_prune_without_retention() -> None:
    insert_rows(10, "completed", age="400 days")
    from axa_django.worker import Worker

    assert Worker(burst=True, install_signals=False).run() == 0
    assert Job.objects.count() == 10


def test_prunejobs_help_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "django", "prunejobs", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=Workers().env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "--older-than" in done.stdout and "--dry-run" in done.stdout


@pytest.mark.django_db(transaction=True)
def test_retention_pruning_gives_up_on_a_locked_table_instead_of_waiting(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    insert_rows(10, "completed", age="2 hours")
    worker = Housekeeper([])
    # SHARE mode lets readers and claims' row locks through but not a DELETE.
    with held("LOCK TABLE axa_queue IN SHARE MODE") as release:
        assert finishes(lambda: housekeeping.run(worker), release, "pruning to give up on the locked table") is None
    assert "housekeeping failed to prune" in caplog.text and "lock timeout" in caplog.text
    assert Job.objects.count() == 10
    housekeeping.run(worker)  # the next housekeeping tries again
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_slow_retention_prune_is_cut_off_by_its_statement_timeout(
    settings: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    monkeypatch.setattr(housekeeping, "STATEMENT_TIMEOUT", 0.5)
    insert_rows(10, "completed", age="2 hours")
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute(
            "CREATE FUNCTION axa_test_stall() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$"
        )
        cursor.execute("CREATE TRIGGER axa_test_stall BEFORE DELETE ON axa_queue EXECUTE FUNCTION axa_test_stall()")
    assert housekeeping.run(Housekeeper([])) is None
    assert "housekeeping failed to prune" in caplog.text and "statement timeout" in caplog.text
    assert Job.objects.count() == 10
