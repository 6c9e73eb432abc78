"""Claiming ahead of free threads: short jobs in batches, long ones not, and nothing held is lost or charged."""

import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from axa_django import Job, JobContext, conf, sql
from axa_django.models import Worker as WorkerRow
from axa_django.worker import Claimed, Worker
from axa_django.worker.dispatcher import FLEET_SHARE
from axa_django.worker.ledger import Ledger
from tests.conftest import AXA_APPS, wait_for
from tests.test_reliability import read_until
from tests.testapp import prefetch_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def runs(log: str) -> tuple[Counter[str], list[int]]:
    """How often each token ran, and the rows claimed ahead (started_at not yet written) at each start."""
    pairs = [line.split() for line in Path(log).read_text().splitlines() if not line.startswith("gate")]
    return Counter(token for token, _ in pairs), [int(held) for _, held in pairs]


def burst(workers, *args: str) -> str:
    proc = workers.start("--burst", *args)
    assert proc.wait(timeout=120) == 0
    return proc.stdout.read()


def test_short_jobs_are_claimed_in_batches_ahead_of_free_threads(workers, log_file):
    prefetch_jobs.held.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(300)])
    burst(workers, "--concurrency", "2")
    counts, held = runs(log_file)
    assert sorted(counts) == sorted(f"t{i}" for i in range(300)) and set(counts.values()) == {1}
    # Rows claimed for free threads have started_at written by the claim itself.
    assert max(held) > 4, held
    assert not Job.objects.exclude(status="completed").exists()
    assert not Job.objects.filter(started_at__isnull=True).exists()


@pytest.mark.parametrize("keys", [300, 3])
def test_jobs_with_a_concurrency_limit_are_claimed_ahead_too_each_key_within_its_limit(log_file, keys):
    prefetch_jobs.held_per_key.perform_later_many(
        [{"key": f"k{i % keys}", "token": f"t{i}", "log": log_file} for i in range(300)]
    )
    assert Worker(burst=True, install_signals=False, concurrency=2).run() == 0
    lines = [line.split() for line in Path(log_file).read_text().splitlines()]
    assert sorted(token for token, _, _ in lines) == sorted(f"t{i}" for i in range(300))
    # A row claimed ahead holds its key's slot until it has run: never two of one key at once.
    assert max(int(most) for _, _, most in lines) == 1
    if keys == 300:
        assert max(int(held) for _, held, _ in lines) > 4, lines
    else:
        assert max(int(held) for _, held, _ in lines) <= keys
    assert not Job.objects.exclude(status="completed").exists()


@pytest.mark.parametrize("args", [["--prefetch", "0"], []], ids=["prefetch-0", "long-jobs"])
def test_long_jobs_or_prefetch_0_hold_no_row_beyond_the_threads(workers, log_file, args):
    seconds = 0.0 if args else 0.2
    prefetch_jobs.held.perform_later_many(
        [{"token": f"t{i}", "log": log_file, "seconds": seconds} for i in range(60 if args else 8)]
    )
    burst(workers, "--concurrency", "2", *args)
    _, held = runs(log_file)
    assert max(held) == 0, held


def hold_rows_behind_a_gate(workers, log_file, tmp_path):
    """A worker of one thread that has run short jobs, now held up by a gate with rows claimed ahead behind it."""
    prefetch_jobs.held.using(priority=10).perform_later_many([{"token": f"a{i}", "log": log_file} for i in range(30)])
    gate = prefetch_jobs.gate.using(priority=5).perform_later(log=log_file, path=str(tmp_path / "open"))
    prefetch_jobs.held.perform_later_many([{"token": f"b{i}", "log": log_file} for i in range(30)])
    proc = workers.start("--concurrency", "1", env=workers.env(AXA_LOG_LEVEL="INFO"))
    wait_for(lambda: "gate 1" in Path(log_file).read_text(), what="the gate to start")
    # The 30 jobs before the gate have run; their outcomes may still be on their way.
    wait_for(lambda: Job.objects.filter(status="completed").count() == 30, what="the first jobs' outcomes")
    ahead = wait_for(
        lambda: list(Job.objects.filter(status="running").exclude(pk=gate.pk).values_list("pk", flat=True)),
        what="rows claimed ahead of the busy thread",
    )
    return proc, gate, ahead


def test_a_stopping_worker_gives_back_the_rows_it_claimed_ahead_unstarted(workers, log_file, tmp_path):
    proc, gate, ahead = hold_rows_behind_a_gate(workers, log_file, tmp_path)
    assert not Job.objects.filter(pk__in=ahead, started_at__isnull=False).exists()
    proc.send_signal(signal.SIGTERM)
    # The gate opens once the stop is under way (on a busy machine the signal can take
    # longer to be handled than the gate's thread to take its next row).
    wait_for(
        lambda: Job.objects.filter(pk__in=ahead, status="queued").count() == len(ahead),
        what="the rows claimed ahead to be given back",
    )
    (tmp_path / "open").touch()
    assert proc.wait(timeout=30) == 0
    output = proc.stdout.read()
    assert "claimed ahead back to the queue, unstarted" in output, output
    for row in Job.objects.filter(pk__in=ahead):
        assert (row.status, row.attempts, row.errors, row.worker_id, row.started_at) == ("queued", 0, [], None, None)
    assert Job.objects.get(pk=gate.pk).status == "completed"
    burst(workers, "--concurrency", "2")
    counts, _ = runs(log_file)
    assert len(counts) == 60 and set(counts.values()) == {1}


@pytest.mark.halved
def test_a_killed_worker_counts_a_loss_only_to_the_jobs_it_had_started(workers, log_file, tmp_path):
    proc, gate, ahead = hold_rows_behind_a_gate(workers, log_file, tmp_path)
    # The gate has run longer than the worker waits to record a start.
    wait_for(lambda: Job.objects.get(pk=gate.pk).started_at is not None, what="the gate's start to be written")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (tmp_path / "open").touch()
    rescuer = workers.start("--concurrency", "2")
    wait_for(lambda: not Job.objects.exclude(status__in=["completed", "failed"]).exists(), what="every job to end")
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=30) == 0
    for row in Job.objects.filter(pk__in=ahead):
        assert (row.status, row.attempts, row.losses) == ("completed", 1, 0), row.errors
        assert row.errors[0]["type"] == "WorkerLost" and "no attempt used" in row.errors[0]["message"]
    gated = Job.objects.get(pk=gate.pk)
    assert (gated.status, gated.attempts, gated.losses, gated.errors[0]["type"]) == ("completed", 1, 1, "WorkerLost")
    counts, _ = runs(log_file)
    assert len(counts) == 60 and set(counts.values()) == {1}


def test_a_worker_presumed_dead_drops_the_rows_it_claimed_ahead(workers, log_file, tmp_path):
    # Cut off past its lease, a live worker's rows are queued again for any worker: its
    # rows claimed ahead then ran here and elsewhere (a restart under three workers ran
    # 1,086 jobs twice). Its next beat finds it presumed dead and drops them.
    proc, gate, ahead = hold_rows_behind_a_gate(workers, log_file, tmp_path)
    worker_id = Job.objects.get(pk=gate.pk).worker_id
    rescuer = workers.start("--concurrency", "2")
    wait_for(lambda: WorkerRow.objects.count() == 2, what="the second worker to register")
    params = {"lease": float(conf.get("LEASE_SECONDS")), "stale": 60, "max_losses": 3}
    with transaction.atomic(), connection.cursor() as cursor:  # what a rescue does once the lease is out
        cursor.execute("DELETE FROM axa_worker WHERE id = %s", [worker_id])
        cursor.execute(sql.RESCUE, params)
        rescued = {row[0] for row in cursor.fetchall()}
        cursor.execute(sql.WAKE)
    assert set(ahead) <= rescued and gate.pk in rescued
    said = read_until(proc, "claimed ahead: the rescue gave them back to the queue")
    # Every row it held but the gate's, which its thread runs.
    assert f"dropped {len(rescued) - 1} job(s)" in said, said
    (tmp_path / "open").touch()
    wait_for(lambda: not Job.objects.exclude(status="completed").exists(), what="every job done")
    for worker in (proc, rescuer):
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    counts, _ = runs(log_file)
    assert len(counts) == 60 and set(counts.values()) == {1}, [token for token, n in counts.items() if n > 1]


def test_a_row_with_history_is_marked_started_when_claimed_ahead(log_file):
    # A job that once killed its worker counts losses from then on, even when claimed ahead.
    fresh = prefetch_jobs.held.perform_later(token="fresh", log=log_file)
    rescued = prefetch_jobs.held.perform_later(token="rescued", log=log_file)
    with connection.cursor() as cursor:
        cursor.execute('UPDATE axa_queue SET errors = \'[{"type": "WorkerLost"}]\' WHERE id = %s', [rescued.pk])
        cursor.execute(sql.compose(sql.CLAIM, [fresh.name], [], None), {"worker": None, "limit": 5, "ahead": True})
        unmarked = {row[0]: row[6] for row in cursor.fetchall()}
    assert unmarked == {fresh.pk: True, rescued.pk: False}


def test_a_job_cancelled_while_claimed_ahead_never_starts(log_file):
    # A job thread taking a claimed-ahead row whose cancel arrived meanwhile ends it unrun.
    worker = Worker(concurrency=1, install_signals=False)
    context = JobContext(uuid.uuid4(), prefetch_jobs.held.name, 1, worker.id)
    context.cancel()
    job = Claimed(context.job_id, context.name, None, 1, None, args_json=json.dumps({"token": "t", "log": log_file}))
    job.context, job.unmarked = context, True
    worker.ledger.hold([job])
    worker.ledger.hand_out([job])
    worker.jobs.stop()
    worker.jobs.loop()
    outcome = worker.ledger.outcomes.get_nowait()
    assert (outcome.status, outcome.started is not None) == ("cancelled", True)
    assert "cancelled before it started" in outcome.error
    assert Path(log_file).read_text() == "" and worker.ledger.held() == 0


def test_the_default_prefetch_does_not_shrink_with_fewer_threads():
    # A claim's round trip costs the same at any thread count: at 8 rows a thread, a
    # worker of 4 threads claimed 32 no-op jobs a round trip and drained half as fast.
    defaults = {Worker(concurrency=n, install_signals=False).options.prefetch for n in (1, 4, 16)}
    assert defaults == {2048}
    assert Worker(concurrency=4, prefetch=0, install_signals=False).options.prefetch == 0


def test_rows_taken_back_from_the_threads_leave_their_ends_behind():
    # A worker presumed dead drops its waiting rows from the heartbeat's thread, which can
    # be during a shutdown: the job threads' ends (None) must stay, or they never end.
    ledger = Ledger()
    held = [Claimed(uuid.uuid4(), "n", None, 1, None) for _ in range(3)]
    ledger.hold(held)
    ledger.hand_out(held[:2])
    ledger.work.put(None)
    ledger.hand_out(held[2:])
    assert ledger.take_waiting() == [job.id for job in held]
    assert ledger.work.get_nowait() is None and ledger.work.empty()
    ledger.forget(job.id for job in held)
    assert ledger.held() == 0


def live_workers(count: int, heartbeat: str = "now()", lease: float = 600.0) -> None:
    """Rows of ``count`` other workers, as a fleet's would be (no process behind them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, heartbeat_at, lease_seconds) "
            f"SELECT gen_random_uuid(), 'elsewhere', 1, 1, '[]', {heartbeat}, %s FROM generate_series(1, %s)",
            [lease, count],
        )


def test_registration_and_each_beat_read_how_many_workers_are_live():
    worker = uuid.uuid4()
    live_workers(5)
    live_workers(3, heartbeat="now() - interval '20 seconds'", lease=10.0)  # their lease ran out: not counted
    options = Worker(concurrency=1, install_signals=False).options
    with connection.cursor() as cursor:
        cursor.execute(sql.REGISTER, options.registration(worker))
        assert cursor.fetchone() == (6,)
        cursor.execute(sql.REGISTER, options.registration(worker))  # registered again: still counted once
        assert cursor.fetchone() == (6,)
        cursor.execute(sql.HEARTBEAT, {"worker": worker, "ids": [], "elect": False})
        assert cursor.fetchone()[-1] == 6


def test_a_worker_row_with_any_lease_or_heartbeat_is_counted_or_not_and_never_fails_the_registration():
    # A lease of 1e12 s put now() minus it out of range: REGISTER failed, the worker claimed
    # without a row, and the rescue ran its jobs a second time (review).
    with connection.cursor() as cursor:
        for heartbeat, lease in [
            ("now()", "1e12"),  # live
            ("now()", "'Infinity'"),  # live
            ("now()", "'NaN'"),  # live: NaN is above every lease
            ("now()", "-1e12"),  # not live: no lease at all
            ("'infinity'", "30"),  # live
            ("'-infinity'", "'Infinity'"),  # not live: no lease reaches back to it
        ]:
            cursor.execute(
                "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, heartbeat_at, lease_seconds) "
                f"VALUES (gen_random_uuid(), 'by hand', 1, 1, '[]', {heartbeat}, {lease})"
            )
        worker = uuid.uuid4()
        cursor.execute(sql.REGISTER, Worker(concurrency=1, install_signals=False).options.registration(worker))
        assert cursor.fetchone() == (5,)
        cursor.execute(sql.HEARTBEAT, {"worker": worker, "ids": [], "elect": True})
        assert cursor.fetchone()[-2:] == (False, 5)  # not the poller either: an elder is live


def test_a_large_fleet_holds_fewer_rows_ahead_in_each_worker(log_file):
    # 32 processes each holding a full prefetch walked over each other's claims: in a fleet
    # of more than FLEET_SHARE live workers each holds its share of FLEET_SHARE x prefetch.
    live_workers(63)
    prefetch_jobs.held.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(50)])
    worker = Worker(burst=True, install_signals=False, concurrency=1, prefetch=64)
    assert worker.run() == 0
    assert worker.ledger.fleet == 64  # as its registration read it (and its beats, had it lived for one)
    assert not Job.objects.exclude(status="completed").exists()
    for _ in range(200):  # jobs of a microsecond (a moving average): the horizon asks for far more than any cap
        worker.ledger.timed(1e-6)
    ahead = {}
    for fleet in (1, FLEET_SHARE, 16, 64, 10_000):
        worker.ledger.fleet = fleet
        ahead[fleet] = worker.dispatcher._ahead()
    assert ahead == {1: 64, FLEET_SHARE: 64, 16: 32, 64: 8, 10_000: 0}
