"""Bulk operations run by real workers, a worker killed mid-way, and a batch stepped against a worker's statements.

The operation's job runs in a runworker subprocess; a job whose worker is SIGKILLed runs
again on another after a lease (3 s here) and goes on from the saved position. The races
drive one batch (bulkjob.Runner.batch) on a connection of its own against the worker's
claim and finish and the admin's per-row actions, one holding the row while the other
meets it (tests/races.py): the batch never waits on a row (SKIP LOCKED), keeps a held one
and tries it again at the end, and its counts add up to what it matched.
"""

from __future__ import annotations

import signal
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.urls import reverse

from axa_django.admin import bulkjob
from axa_django.models import Job
from axa_django.models.queue import BulkOperation
from tests import test_races
from tests.conftest import Workers, wait_for
from tests.races import Actor, Move, check_invariants, run_into, view, where
from tests.test_races import MOVES, build

# Failed jobs in the history, as a worker leaves them: one attempt, one error. Run again they fail again.
FAILED_ROWS = """
INSERT INTO axa_history (id, name, args, status, error, errors, attempts, max_attempts, run_at, started_at, finished_at)
SELECT gen_random_uuid(), 'CountWorker', jsonb_build_object('fail', true, 'n', n), 'failed', 'RuntimeError: told to fail',
       jsonb_build_array(jsonb_build_object('attempt', 1, 'type', 'builtins.RuntimeError', 'message', 'told to fail')),
       1, 1, now(), now(), now()
FROM generate_series(1, %s) AS n
"""
# The CountWorker rows by how many attempts' errors they hold: 1 not retried (or not run yet), 2 run once more.
RUNS = "SELECT jsonb_array_length(errors), status, count(*) FROM axa_queue WHERE name = 'CountWorker' GROUP BY 1, 2"
QUIET = {"AXA_LOG_LEVEL": "CRITICAL"}  # a line per failed job would fill the pipe no one reads
SHORT_LEASE = {**QUIET, "AXA_TEST_LEASE": "2"}  # the killed worker's job is taken up 2 s after its last beat


def failed_rows(n: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(FAILED_ROWS, [n])


def runs() -> dict[tuple[int, str], int]:
    with connection.cursor() as cursor:
        cursor.execute(RUNS)
        return {(errors, status): count for errors, status, count in cursor.fetchall()}


def start_retry(client: Client, batch_size: int, pause_ms: int) -> BulkOperation:
    url = reverse("admin:axa_django_bulkoperation_start", args=["failedjob", "retry"]) + "?name=CountWorker"
    response = client.post(url, {"batch_size": batch_size, "pause_ms": pause_ms})
    assert response.status_code == 302, response.content.decode()[:2000]
    return BulkOperation.objects.latest("id")


def fresh(op: BulkOperation) -> BulkOperation:
    return BulkOperation.objects.get(pk=op.pk)


def counted(op: BulkOperation) -> tuple[int, int, int]:
    return op.matched, op.changed, op.skipped


@pytest.mark.django_db(transaction=True)
def test_a_worker_retries_hundreds_of_failed_jobs_in_batches_with_progress_on_the_way(
    admin_client: Client, workers: Workers
) -> None:
    n = 600
    failed_rows(n)
    op = start_retry(admin_client, batch_size=50, pause_ms=100)
    data_url = reverse("admin:axa_django_bulkoperation_data", args=[op.pk])
    assert "No worker is running" in admin_client.get(data_url).json()["unserved"]
    workers.start("--concurrency", "2", env=workers.env(**QUIET))

    def mid_way() -> dict[str, Any] | None:
        data = admin_client.get(data_url).json()
        return data if data["status"] == "running" and 0 < int(data["changed"]) < n else None

    data = wait_for(mid_way, 60, "the operation part way")
    assert data["unserved"] == "" and data["live"]
    seen = fresh(op)
    retried = n - runs().get((1, "failed"), 0)  # no longer failed with their first error only
    assert seen.changed <= retried <= n and seen.matched == seen.changed

    wait_for(lambda: fresh(op).status == "done", 60, "the operation to end")
    wait_for(lambda: runs().get((2, "failed")) == n, 60, "every retried job to run and fail again")
    op = fresh(op)
    assert counted(op) == (n, n, 0) and op.batches == n // 50
    assert runs() == {(2, "failed"): n}  # each ran exactly once more: none retried twice
    assert admin_client.get(data_url).json()["changed"] == f"{n:,}"


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_way_and_another_goes_on_from_the_saved_position(
    admin_client: Client, workers: Workers
) -> None:
    n = 600
    failed_rows(n)
    op = start_retry(admin_client, batch_size=50, pause_ms=100)
    first = workers.start("--job", bulkjob.NAME, env=workers.env(**SHORT_LEASE))  # runs the bulk job only
    running = Job.objects.filter(name=bulkjob.NAME, status="running")
    wait_for(lambda: fresh(op).batches >= 3 and running.exists(), 60, "three batches")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    at_kill = fresh(op)
    assert at_kill.status == "running" and 0 < at_kill.changed < n
    # The operation's job when it was killed. A slice lasts at most a lease (2 s here): on a
    # loaded machine the job had handed the operation on to a new one before the kill, or the
    # next worker's did after it, and the operation's last job never met a kill (losses 0).
    cut = set(running.values_list("pk", flat=True))
    assert cut
    workers.start("--concurrency", "2", env=workers.env(**SHORT_LEASE))
    wait_for(lambda: fresh(op).status == "done", 90, "another worker to take the operation up and end it")
    wait_for(lambda: runs().get((2, "failed")) == n, 60, "every retried job to run and fail again")
    op = fresh(op)
    assert counted(op) == (n, n, 0)
    assert runs() == {(2, "failed"): n}  # none retried twice, none left out
    assert set(Job.objects.filter(pk__in=cut).values_list("status", "losses")) == {("completed", 1)}
    notes = list(LogEntry.objects.filter(object_id=str(op.pk)).values_list("change_message", flat=True))
    assert any(note.startswith("resumed after id ") for note in notes), notes


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_a_worker_asked_to_stop_hands_its_bulk_operation_on_and_exits_within_a_slice(
    admin_client: Client, workers: Workers
) -> None:
    # One run of the job walked the whole operation: SIGTERM (or the Workers page's Stop)
    # waited for it, here 300 batches a second apart (the adversarial review's case).
    n = 600
    failed_rows(n)
    op = start_retry(admin_client, batch_size=2, pause_ms=1000)
    first = workers.start("--job", bulkjob.NAME, env=workers.env(**QUIET))
    wait_for(lambda: fresh(op).batches >= 2, 60, "two batches")
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=bulkjob.SLICE_SECONDS + 20) == 0  # a slice here: LEASE_SECONDS (3 s)
    handed = fresh(op)
    assert handed.status == "running" and handed.batches < n // 2
    job = Job.objects.get(pk=handed.job_id)
    assert job.status == "queued"  # the rest, for the next worker
    notes = list(LogEntry.objects.filter(object_id=str(op.pk)).values_list("change_message", flat=True))
    assert not any(note.startswith("resumed") for note in notes), notes  # a hand-on is no resumption


# Races: one batch against the statements that meet its rows.


def _bulk(kind: str) -> Move:
    def run(actor: Actor, s: Any) -> tuple[int, int, int]:
        op = BulkOperation.objects.get(pk=OP_OF[s.id])
        runner = bulkjob.Runner(op.pk, None)
        runner.batch(bulkjob.rebuild(op))
        op.refresh_from_db()  # in the actor's transaction: its own writes
        return op.matched, op.changed, len(op.busy)

    return Move(f"bulk {kind}", run)


BULK = {f"bulk {kind}": _bulk(kind) for kind in ("retry", "cancel", "delete")}
# The operation each race's row is the subject of.
OP_OF: dict[uuid.UUID, int] = {}
W, C = True, False
# The race tests' own fixtures: three actors, and a worker's connection to build rows with.
actors, setup_conn = test_races.actors, test_races.setup_conn

# fmt: off
RACES = [
    # state    A holds the row  B meets it     waits commit: B, op (matched, changed, skipped), row
    #                                                rollback: B, op, row
    ("failed",  "retry",        "bulk retry",  C, ((1, 0, 1), (1, 0, 1), "queued@queue"),
                                                  ((1, 0, 1), (1, 1, 0), "queued@queue")),
    ("failed",  "bulk retry",   "retry",       W, (0, (1, 1, 0), "queued@queue"),
                                                  (1, (0, 0, 0), "queued@queue")),
    ("failed",  "job.delete",   "bulk retry",  C, ((1, 0, 1), (1, 0, 1), "gone"),
                                                  ((1, 0, 1), (1, 1, 0), "queued@queue")),
    ("queued",  "CLAIM",        "bulk cancel", C, ((1, 0, 1), (1, 1, 0), "running+cancel@queue"),
                                                  ((1, 0, 1), (1, 1, 0), "cancelled@history")),
    ("queued",  "bulk cancel",  "CLAIM",       C, (0, (1, 1, 0), "cancelled@history"),
                                                  (0, (0, 0, 0), "queued@queue")),
    ("running", "FINISH ok",    "bulk cancel", C, ((1, 0, 1), (1, 0, 1), "completed@history"),
                                                  ((1, 0, 1), (1, 1, 0), "running+cancel@queue")),
    ("running", "bulk cancel",  "FINISH ok",   W, (1, (1, 1, 0), "completed@history"),
                                                  (1, (0, 0, 0), "completed@history")),
    ("running", "FINISH ok",    "bulk delete", C, ((1, 0, 1), (1, 1, 0), "gone"),
                                                  ((1, 0, 1), (1, 1, 0), "gone")),
]
# fmt: on


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("state", "a", "b", "waits", "committed", "rolled_back"), RACES, ids=[f"{r[0]}: {r[1]} vs {r[2]}" for r in RACES]
)
def test_a_batch_meets_a_worker_or_the_admin_on_one_row(
    actors: tuple[Actor, Actor, Actor],
    setup_conn: psycopg.Connection[Any],
    state: str,
    a: str,
    b: str,
    waits: bool,
    committed: tuple[Any, ...],
    rolled_back: tuple[Any, ...],
) -> None:
    holder, other, _ = actors
    moves = {**MOVES, **BULK}
    kind = (a if a.startswith("bulk") else b).split()[1]
    for commit, (gave, counts, row) in ((True, committed), (False, rolled_back)):
        holder.ready()
        other.ready()
        s = build(setup_conn, state)
        op = BulkOperation.objects.create(
            kind=kind, list_name="job", query=f"q={s.id}", status="running", bound=bulkjob.bound("default")
        )
        OP_OF[s.id] = op.pk
        _hold(holder, s, moves[a])
        [ran] = run_into(holder, [(other, moves[b])], s, waits, commit)
        runner = bulkjob.Runner(op.pk, None)
        runner.busy_round(bulkjob.rebuild(fresh(op)), last=True)  # the held row, tried again at the end
        found = view(s.id)
        check_invariants([s.id] if found else [], [] if found else [s.id])
        op = fresh(op)
        assert op.matched == op.changed + op.skipped and op.busy == []
        end = "commit" if commit else "rollback"
        assert (ran.get(), counted(op), where(found)) == (gave, counts, row), end
        Job.objects.filter(pk=s.id).delete()
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM axa_worker")


def _hold(holder: Actor, s: Any, move: Move) -> None:
    """A runs a batch in its open transaction: its locks held, nothing committed."""
    holder.begin()
    try:
        holder.call(move.run, holder, s)
    except BaseException:
        holder.end(False)
        raise
