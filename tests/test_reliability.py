"""Leases, guarded finish, hard shutdown, database outages and chaos, with real processes."""

import itertools
import random
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connections
from django.utils import timezone

from axa_django import Job, conf, sql
from axa_django.execution import Outcome, _as_json, finish
from axa_django.worker import connect
from axa_django.worker.ledger import UNWRITTEN_MOST
from tests.conftest import AXA_APPS, CountingCursor, restart_postgres, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def lease() -> float:
    return float(conf.get("LEASE_SECONDS"))


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def read_until(proc, text: str, timeout: float = 30) -> str:
    """What ``proc`` printed up to the first line holding ``text``; fails at the deadline."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            seen.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"{text!r} not printed within {timeout}s: {''.join(seen)}"
    return "".join(seen)


def count_where(**filters) -> int:
    """Count rows, riding out a database that is restarting."""
    try:
        return Job.objects.filter(**filters).count()
    except OperationalError:
        connections.close_all()
        return -1


@pytest.mark.halved
def test_a_killed_worker_runs_again_a_bounded_number_of_the_jobs_it_had_finished(workers, log_file):
    # Outcomes are written in batches: a worker killed runs again the jobs whose outcomes
    # were on their way. At 27,000 jobs/s the job threads outran the finisher and a kill
    # ran 800-1,600 jobs twice; here the database takes no outcome at all (the history is
    # locked), and the job threads stop once UNWRITTEN_MOST wait, not at every row claimed ahead.
    total, threads = 4 * UNWRITTEN_MOST, 4  # the defaults: 4 threads, 2,048 rows claimed ahead at most
    jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(total)])
    with connect("default", "test lock") as holder, connect("default", "test watcher") as watcher:
        holder.execute("SET idle_in_transaction_session_timeout = 0")  # a worker connection's is half a lease
        holder.autocommit = False
        holder.execute("LOCK TABLE axa_history IN SHARE MODE")  # no finished row goes in
        proc = workers.start()
        output: list[str] = []
        said = threading.Event()

        def read() -> None:
            for line in proc.stdout:
                output.append(line)
                if "job threads wait for the database" in line:
                    said.set()

        threading.Thread(target=read, daemon=True).start()
        wait_for(lambda: said.is_set() or len(lines(log_file)) > UNWRITTEN_MOST + threads, what="the threads to stop")
        ran = len(lines(log_file))
        assert UNWRITTEN_MOST <= ran <= UNWRITTEN_MOST + threads, f"{ran} jobs ran, none written"
        assert said.is_set(), "".join(output)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Its finisher's statement still waits on the lock: end it as a dead host's peer would.
        watcher.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'axa\\_django %%' AND pid <> ALL(%s)",
            [[holder.info.backend_pid, watcher.info.backend_pid]],
        )
        holder.rollback()
    second = workers.start()
    wait_for(lambda: Job.objects.filter(status="completed").count() == total, timeout=60, what="every job done")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0
    counts = Counter(lines(log_file))
    assert sorted(counts) == sorted(f"t{i}" for i in range(total))
    twice = sum(1 for n in counts.values() if n > 1)
    assert 0 < twice <= ran and max(counts.values()) == 2, (twice, ran)


@pytest.mark.halved
def test_one_failed_heartbeat_is_retried_within_the_lease(workers):
    # The heartbeat waited a whole interval after a failed beat: one beat held up for its
    # timeout (a lock, a slow server) left the worker's row a full lease old, so another
    # worker's rescue could take a live worker's running jobs (CI saw jobs run twice).
    lease = 9.0  # beats every 3 s, each bounded by a 3 s timeout
    proc = workers.start("--concurrency", "1", env=workers.env(AXA_TEST_LEASE=str(lease)))
    with connect("default", "test lock") as holder, connect("default", "test watcher") as watcher:
        holder.execute("SET idle_in_transaction_session_timeout = 0")  # a worker connection's is half a lease

        def beat() -> Any:
            row = watcher.execute("SELECT id, heartbeat_at FROM axa_worker").fetchone()
            return row

        worker_id, first = wait_for(beat, what="the worker to register")
        _, last = wait_for(lambda: (row := beat()) and row[1] > first and row, what="a beat")
        holder.autocommit = False
        holder.execute("SELECT 1 FROM axa_worker WHERE id = %s FOR UPDATE", [worker_id])  # the next beat waits
        read_until(proc, "heartbeat failed", timeout=30)
        holder.rollback()
        _, after = wait_for(lambda: (row := beat()) and row[1] > last and row, what="the next beat")
    gap = (after - last).total_seconds()
    print(f"{gap:.2f}s between the beats around the failed one (lease {lease:g}s)")
    assert gap < lease, f"{gap:.1f}s between two beats: the lease ({lease:g}s) ran out"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.mark.halved
def test_the_heartbeat_keeps_its_cadence_while_housekeeping_is_held_up(workers):
    # Each beat waited an interval after the housekeeping that follows it: housekeeping
    # held up for its 60% of an interval made beats 1.6 intervals apart, the lease's
    # margin gone to a hiccup (two workers under load: a leader of a key rescued while it
    # ran, a follower of the key started beside it).
    lease = 6.0  # beats every 2 s
    interval = lease / 3
    proc = workers.start("--concurrency", "1", env=workers.env(AXA_TEST_LEASE=str(lease)))
    with connect("default", "test lock") as holder, connect("default", "test watcher") as watcher:
        holder.execute("SET idle_in_transaction_session_timeout = 0")

        def beat() -> Any:
            return watcher.execute("SELECT heartbeat_at FROM axa_worker").fetchone()

        first = wait_for(beat, what="the worker to register")[0]
        wait_for(lambda: (row := beat()) and row[0] > first, what="a beat")
        holder.autocommit = False
        # The rescue's sweep of finished parents reads this table: each round of housekeeping
        # waits for the lock for all the time it has.
        holder.execute("LOCK TABLE axa_dependency IN ACCESS EXCLUSIVE MODE")
        read_until(proc, "housekeeping on the heartbeat's connection failed", timeout=30)
        beats: list[Any] = []

        def five_beats() -> bool:
            row = beat()
            if row and beats[-1:] != [row[0]]:
                beats.append(row[0])
            return len(beats) == 5

        wait_for(five_beats, timeout=30, what="five beats")
        holder.rollback()
    gaps = sorted((b - a).total_seconds() for a, b in itertools.pairwise(beats))
    print(
        f"beats {', '.join(f'{gap:.2f}' for gap in gaps)}s apart while housekeeping was held up (interval {interval:g}s)"
    )
    assert gaps[len(gaps) // 2] < 1.3 * interval, f"beats {gaps}s apart: the interval is {interval:g}s"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.mark.halved
def test_a_killed_workers_job_runs_again_elsewhere_within_two_leases(workers, log_file):
    # At the defaults (one attempt): a lost worker does not spend it.
    job = jobs.slow.perform_later(60, log=log_file, token="long")
    first = workers.start("--concurrency", "1")
    wait_for(lambda: any(line.startswith("start long") for line in lines(log_file)), what="first run")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    killed_at = time.monotonic()
    second = workers.start("--concurrency", "1")
    wait_for(
        lambda: len([x for x in lines(log_file) if x.startswith("start long")]) == 2,
        timeout=2 * lease() + 10,
        what="rerun",
    )
    recovered = time.monotonic() - killed_at
    print(f"job back to running after {recovered:.2f}s (lease {lease()}s)")
    row = fresh(job)
    assert (row.status, row.attempts, row.losses) == ("running", 1, 1)
    assert row.errors[0]["type"] == "WorkerLost"
    assert str(second.pid) in lines(log_file)[1]


@pytest.mark.halved
def test_a_frozen_workers_job_runs_again_at_the_defaults_and_its_late_outcome_is_refused(workers, log_file):
    # SIGSTOP: a VM paused past the lease. One attempt (the default) is not spent by the loss.
    job = jobs.slow.perform_later(1.0, log=log_file, token="frozen")
    frozen = workers.start("--concurrency", "1")
    wait_for(lambda: any(line.startswith("start frozen") for line in lines(log_file)), what="first run")
    frozen.send_signal(signal.SIGSTOP)
    try:
        other = workers.start("--concurrency", "1")
        wait_for(lambda: fresh(job).status == "completed", timeout=2 * lease() + 30, what="the rerun elsewhere")
        row = fresh(job)
        assert (row.attempts, row.losses, [entry["type"] for entry in row.errors]) == (1, 1, ["WorkerLost"])
        assert f"end frozen {other.pid}" in lines(log_file)
    finally:
        frozen.send_signal(signal.SIGCONT)
    # Thawed, the old worker ends its run, but its outcome is not written over the new one.
    wait_for(lambda: f"end frozen {frozen.pid}" in lines(log_file), what="the thawed run to end")
    for proc in (frozen, other):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    after = fresh(job)
    assert (after.status, after.worker_id, after.finished_at) == ("completed", row.worker_id, row.finished_at)
    assert "not written: their jobs were rescued or changed meanwhile" in frozen.stdout.read()


@pytest.mark.halved
def test_a_job_running_three_leases_with_its_worker_alive_runs_once(workers, log_file):
    job = jobs.slow.perform_later(3 * lease(), log=log_file, token="long")
    procs = [workers.start("--concurrency", "1"), workers.start("--concurrency", "1")]
    wait_for(lambda: fresh(job).status == "completed", timeout=3 * lease() + 30, what="long job to finish")
    assert [line.split()[0] for line in lines(log_file)] == ["start", "end"]
    assert fresh(job).attempts == 1
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_an_old_workers_outcome_cannot_overwrite_a_reclaimed_job():
    job = jobs.add.perform_later(1)
    old, new = uuid.uuid4(), uuid.uuid4()
    Job.objects.filter(pk=job.pk).update(status="running", worker_id=new)
    with connect("default", "test") as conn, conn.cursor() as cursor:
        unwritten = finish(cursor, [Outcome(job.pk, job.name, 1, "failed", error="late")], old)
        assert unwritten == {job.pk}
        assert finish(cursor, [Outcome(job.pk, job.name, 1, "completed", result="1")], new) == set()
    row = fresh(job)
    assert (row.status, row.result, row.error) == ("completed", 1, None)


def test_completions_that_returned_none_are_written_by_arrays_as_the_json_finish_writes_them():
    worker = uuid.uuid4()
    made = [jobs.add.perform_later(i) for i in range(6)]
    Job.objects.filter(pk__in=[j.pk for j in made]).update(status="running", worker_id=worker, attempts=1)
    # Two claimed ahead (no started_at yet: the outcome carries it), one rescued meanwhile.
    Job.objects.filter(pk__in=[made[0].pk, made[3].pk]).update(started_at=None)
    Job.objects.filter(pk__in=[made[1].pk, made[4].pk]).update(started_at=timezone.now())
    Job.objects.filter(pk=made[5].pk).update(worker_id=uuid.uuid4())
    started = time.time() - 5
    outcome = lambda job, at=None: Outcome(job.pk, job.name, 1, "completed", result="null", started=at)  # noqa: E731
    with connect("default", "test") as conn:
        conn.cursor_factory = CountingCursor
        with conn.cursor() as cursor:
            CountingCursor.sent = []
            batch = [outcome(made[0], started), outcome(made[1]), outcome(made[2]), outcome(made[5])]
            assert finish(cursor, batch, worker) == {made[5].pk}
            assert CountingCursor.sent[0] == sql.FINISH_COMPLETED and sql.FINISH not in CountingCursor.sent
            # The same outcomes by the JSON statement, for the rows beside them.
            document = ",".join(_as_json(o) for o in [outcome(made[3], started), outcome(made[4])])
            cursor.execute(sql.FINISH, {"outcomes": f"[{document}]", "worker": worker})
            assert cursor.fetchone()[1] == []
    read = ["status", "result", "error", "errors", "attempts", "worker_id"]
    rows = {row.pk: row for row in Job.objects.all()}
    for by_arrays, by_json in [(made[0], made[3]), (made[1], made[4])]:
        a, j = rows[by_arrays.pk], rows[by_json.pk]
        assert (
            [getattr(a, f) for f in read] == [getattr(j, f) for f in read] == ["completed", None, None, [], 1, worker]
        )
        assert a.finished_at is not None and j.finished_at is not None
    assert rows[made[2].pk].status == "completed" and rows[made[2].pk].started_at is None
    for ahead in (made[0], made[3]):
        assert abs(rows[ahead.pk].started_at.timestamp() - started) < 1e-3
    assert rows[made[5].pk].status == "running"  # not this worker's any more: left as it is


def test_a_second_signal_gives_running_jobs_back_at_once_and_exits_non_zero(workers, log_file):
    job = jobs.slow.perform_later(60, log=log_file, token="x")
    proc = workers.start("--concurrency", "2", env=workers.env(AXA_LOG_LEVEL="INFO"))
    wait_for(lambda: lines(log_file), what="job start")
    proc.send_signal(signal.SIGTERM)
    # Two signals that reach a process before its main thread runs the handler are one signal
    # (the kernel and Python both keep a flag, not a count): the second goes once the first is heard.
    output = read_until(proc, "finishing jobs in progress")
    assert Job.objects.filter(pk=job.pk, status="running").exists(), output
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1
    row = fresh(job)
    assert (row.status, row.worker_id, row.started_at) == ("queued", None, None)
    assert row.errors[-1]["type"] == "Interrupted"


@pytest.mark.halved
def test_the_grace_period_running_out_requeues_and_exits_non_zero(workers, log_file):
    job = jobs.slow.perform_later(60, log=log_file, token="x")
    done = jobs.add.perform_later(1)
    proc = workers.start("--concurrency", "2", "--grace-period", "0.5")
    wait_for(lambda: lines(log_file) and fresh(done).status == "completed", what="jobs to start")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 1
    assert "grace period over" in proc.stdout.read()
    assert fresh(job).status == "queued"


@pytest.mark.halved
def test_a_dead_workers_row_is_removed_and_a_live_one_kept(workers):
    proc = workers.start("--concurrency", "1")
    from axa_django.models import Worker as WorkerRow

    wait_for(lambda: WorkerRow.objects.filter(pid=proc.pid).exists(), what="worker row")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    live = workers.start("--concurrency", "1")
    wait_for(
        lambda: not WorkerRow.objects.filter(pid=proc.pid).exists(), timeout=2 * lease() + 10, what="dead row gone"
    )
    assert WorkerRow.objects.filter(pid=live.pid).exists()


@pytest.mark.halved
def test_workers_ride_out_a_postgres_restart_mid_drain(workers, log_file):
    total = 5000
    jobs.trace.perform_later_many([{"token": str(i), "log": log_file, "seconds": 0.002} for i in range(total)])
    procs = [workers.start("--concurrency", "4") for _ in range(3)]
    wait_for(lambda: count_where(status="completed") >= total // 5, timeout=120, what="a fifth done")
    restarted_at = time.monotonic()
    restart_postgres()
    wait_for(lambda: count_where(status="completed") == total, timeout=240, what="every job completed")
    print(f"drained {total} jobs; all done {time.monotonic() - restarted_at:.1f}s after the restart")
    runs = Counter(line.split()[0] for line in lines(log_file))
    assert set(runs) == {str(i) for i in range(total)}
    print(f"jobs run more than once: {sum(1 for n in runs.values() if n > 1)}")
    for proc in procs:
        assert proc.poll() is None, "a worker died in the outage:\n" + proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_worker_whose_connection_drops_as_it_starts_retries_and_starts(workers):
    # The restart test above caught a worker still starting (reading the applied
    # migrations) when the server went down: it exited 1 with a traceback. Here the
    # same moment, made certain: the read waits on a lock and its backend is ended.
    with connect("default", "test lock") as holder, connect("default", "test watcher") as watcher:
        watcher.autocommit = True  # pg_stat_activity is read once per transaction
        holder.execute("SET idle_in_transaction_session_timeout = 0")  # a worker connection's is half a lease
        holder.autocommit = False
        holder.execute("LOCK TABLE django_migrations IN ACCESS EXCLUSIVE MODE")
        proc = workers.start("--concurrency", "1", env=workers.env(AXA_LOG_LEVEL="INFO"))

        def blocked() -> int | None:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() "
                "AND query LIKE %s",
                ["%django_migrations%"],
            ).fetchone()
            return row[0] if row else None

        pid = wait_for(blocked, what="the starting worker to wait for the migrations table")
        watcher.execute("SELECT pg_terminate_backend(%s)", [pid])
        holder.rollback()
    job = jobs.add.perform_later(2, b=3)
    wait_for(lambda: fresh(job).status == "completed" or proc.poll() is not None, timeout=60, what="the job done")
    assert proc.poll() is None, "the worker died as it started:\n" + proc.stdout.read()
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    assert "cannot read the applied migrations" in output and "retrying" in output, output


@pytest.mark.halved
def test_chaos_kill_a_random_worker_every_second(workers, log_file):
    total, concurrency = 5000, "4"
    # Every kill costs the jobs in flight an attempt; give them plenty.
    chaos = jobs.trace.using(max_attempts=50)
    chaos.perform_later_many([{"token": str(i), "log": log_file, "seconds": 0.02} for i in range(total)])
    live = [workers.start("--concurrency", concurrency) for _ in range(3)]
    killed: set[int] = set()
    rng = random.Random(7)
    start = time.monotonic()
    for second in range(10):
        deadline = start + second + 1
        wait_for(lambda d=deadline: time.monotonic() >= d, what="next second")
        victim = live.pop(rng.randrange(len(live)))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        killed.add(victim.pid)
        live.append(workers.start("--concurrency", concurrency))
    wait_for(lambda: Job.objects.filter(status="completed").count() == total, timeout=300, what="all completed")
    elapsed = time.monotonic() - start
    runs: dict[str, list[str]] = defaultdict(list)
    for line in lines(log_file):
        token, pid = line.split()
        runs[token].append(pid)
    assert set(runs) == {str(i) for i in range(total)}, "a job was lost"
    repeated = {token: pids for token, pids in runs.items() if len(pids) > 1}
    # A job runs again only when an earlier run's worker was killed.
    for token, pids in repeated.items():
        assert all(int(pid) in killed for pid in pids[:-1]), (token, pids)
    rescued = Job.objects.filter(attempts__gt=1).count()
    print(
        f"chaos: {total} jobs, {len(killed)} kills, {rescued} jobs started again after a kill, "
        f"{len(repeated)} ran to the end twice, all done in {elapsed:.1f}s"
    )
    for proc in live:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_an_outcome_reached_while_postgres_is_down_is_written_when_it_returns(workers, log_file):
    job = jobs.slow.perform_later(2.0, log=log_file, token="x")
    proc = workers.start("--concurrency", "1", env=workers.env(AXA_LOG_LEVEL="INFO"))
    wait_for(lambda: lines(log_file), what="job start")
    restart_postgres()  # the worker's three connections all drop while the job runs
    wait_for(lambda: count_where(pk=job.pk, status="completed") == 1, timeout=60, what="outcome written")
    assert lines(log_file) == [f"start x {proc.pid}", f"end x {proc.pid}"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    output = proc.stdout.read()
    assert "reconnecting" in output or "cannot write" in output


@pytest.mark.halved
def test_a_rescue_stuck_on_a_lock_does_not_cost_its_worker_the_lease(workers, log_file):
    # The rescue and its kin run on the heartbeat's thread after a beat: one that waits on a
    # lock is cut at what is left of the interval, never holding back the next beat.
    job = jobs.slow.perform_later(2 * lease(), log=log_file, token="long")  # past a lease: six beats
    with connect("default", "locker") as locker:
        locker.execute("SET idle_in_transaction_session_timeout = 0")
        locker.autocommit = False
        locker.execute("LOCK TABLE axa_dependency IN ACCESS EXCLUSIVE MODE")  # the rescue's sweep waits on it
        procs = [workers.start("--concurrency", "1"), workers.start("--concurrency", "1")]
        wait_for(lambda: fresh(job).status == "completed", timeout=2 * lease() + 30, what="long job to finish")
        locker.rollback()
    assert [line.split()[0] for line in lines(log_file)] == ["start", "end"]
    assert fresh(job).attempts == 1 and fresh(job).losses == 0
    outputs = []
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        outputs.append(proc.communicate(timeout=30)[0])
        assert proc.returncode == 0
    assert all("housekeeping on the heartbeat's connection failed" in output for output in outputs), outputs
