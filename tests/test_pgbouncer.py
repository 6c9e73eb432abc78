"""Workers behind a real PgBouncer, in transaction and in session mode.

Contract (issue 10, section 3): ``AXA_DJANGO["TRANSACTION_POOLING"] = True`` makes the
worker use no server-side prepared statements, poll instead of LISTEN, and leave no
session state; a worker reaching a transaction pool without it refuses to start,
naming PgBouncer and TRANSACTION_POOLING, before it claims anything.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest
from django.db import connection

from axa_django import Job
from tests.conftest import AXA_APPS, Workers, wait_for
from tests.pgbouncer import POOL_SIZE, PgBouncer, finish
from tests.testapp import jobs, pooler_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

Start = Callable[..., PgBouncer]


def worker_env(workers: Workers, bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    return workers.env(DATABASE_URL=bouncer.url(connection.settings_dict["NAME"]), **extra)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    return finish(proc)


def drain(bouncer: PgBouncer, workers: Workers, job: object, log: str, count: int, **env: str) -> None:
    """Enqueue ``count`` jobs, drain them with 2 burst workers x 4 threads; each must run exactly once."""
    job.perform_later_many([{"token": f"t{i}", "log": log} for i in range(count)])  # type: ignore[attr-defined]
    procs = [workers.start("--burst", "--concurrency", "4", env=worker_env(workers, bouncer, **env)) for _ in range(2)]
    for proc in procs:
        code, output = finish(proc)
        assert code == 0, output
    runs = Counter(Path(log).read_text().split())
    assert len(runs) == count and set(runs.values()) == {1}, [t for t, n in runs.items() if n > 1][:10]
    assert Job.objects.filter(status="completed").count() == count
    assert not Job.objects.exclude(status="completed").exists()


def test_the_rig_runs_pgbouncer_in_the_mode_asked(pgbouncer: Start) -> None:
    for mode in ("transaction", "session"):
        bouncer = pgbouncer(mode)
        config = {row[0]: row[1] for row in bouncer.admin("SHOW CONFIG")}
        assert (config["pool_mode"], config["default_pool_size"]) == (mode, str(POOL_SIZE))
        with bouncer.connect(connection.settings_dict["NAME"]) as conn:
            name = conn.execute("SELECT current_database()").fetchone()
        assert name == (connection.settings_dict["NAME"],)


def test_transaction_pool_with_transaction_pooling_runs_2000_jobs_exactly_once(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    drain(pgbouncer("transaction"), workers, pooler_jobs.pooled_record, log_file, 2000, AXA_TEST_POOLING="1")


def test_transaction_pool_runs_jobs_with_a_concurrency_limit_exactly_once(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    # The limited claim is a pipeline of walk and claim in one implicit transaction, passing the walk's
    # rows on in a transaction-local setting: all within one pooled transaction.
    drain(pgbouncer("transaction"), workers, pooler_jobs.limited_record, log_file, 500, AXA_TEST_POOLING="1")


def test_session_pool_with_defaults_runs_2000_jobs_exactly_once(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    drain(pgbouncer("session"), workers, jobs.record, log_file, 2000)


def test_session_pool_passes_notify_to_an_idle_worker(pgbouncer: Start, workers: Workers, log_file: str) -> None:
    # Polls and housekeeping (a third of the lease) both a minute apart: only NOTIFY wakes it sooner.
    env = worker_env(workers, pgbouncer("session"), AXA_TEST_POLL="60", AXA_TEST_LEASE="180")
    first = jobs.record.perform_later("first", log_file)
    proc = workers.start("--concurrency", "1", env=env)
    wait_for(lambda: Job.objects.get(id=first.id).status == "completed", what="the worker's first job")
    second = jobs.record.perform_later("second", log_file)
    wait_for(lambda: Job.objects.get(id=second.id).status == "completed", timeout=15, what="pickup by NOTIFY")
    code, output = stop(proc)
    assert code == 0, output


def test_transaction_pool_with_prepared_statements_refuses_to_start(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(50)])
    proc = workers.start("--burst", "--concurrency", "4", env=worker_env(workers, pgbouncer("transaction")))
    code, output = finish(proc)
    assert code == 2, output
    assert "PgBouncer" in output and "TRANSACTION_POOLING" in output, output
    assert Job.objects.filter(status="queued", attempts=0).count() == 50
    assert Path(log_file).read_text() == ""


def rotating_pool(pgbouncer: Start, servers: int) -> PgBouncer:
    """A transaction pool whose ``servers`` server connections take sequential transactions in turn.

    So a busy pool hands a client's transactions to whichever server is free, here
    deterministically: two connections alternating statements never meet on one backend.
    """
    bouncer = pgbouncer("transaction", pool_size=servers, round_robin=True)
    name = connection.settings_dict["NAME"]
    bouncer.open_servers(name, servers)
    assert [row[3] for row in bouncer.admin("SHOW SERVERS") if row[2] == name] == ["idle"] * servers
    with bouncer.connect(name, autocommit=True) as one, bouncer.connect(name, autocommit=True) as other:
        pids = [conn.execute("SELECT pg_backend_pid()").fetchone() for _ in range(3) for conn in (one, other)]
    assert not [pair for pair in zip(pids[::2], pids[1::2], strict=True) if pair[0] == pair[1]], pids
    return bouncer


@pytest.mark.parametrize("servers", [2, 3])
def test_transaction_pool_taking_turns_with_prepared_statements_refuses_to_start(
    pgbouncer: Start, workers: Workers, log_file: str, servers: int
) -> None:
    # The check that only compared the pids of two connections let the worker start here, and its
    # prepared claims failed ("prepared statement does not exist"): one connection's own backend
    # changing between its transactions is what gives the pool away.
    bouncer = rotating_pool(pgbouncer, servers)
    jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(50)])
    proc = workers.start("--burst", "--concurrency", "4", env=worker_env(workers, bouncer))
    code, output = finish(proc)
    assert code == 2, output
    assert "PgBouncer" in output and "TRANSACTION_POOLING" in output, output
    assert "served by one PostgreSQL backend, then by another" in output, output
    assert Job.objects.filter(status="queued", attempts=0).count() == 50
    assert Path(log_file).read_text() == ""


def test_transaction_pool_taking_turns_with_notify_warns_and_polls(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    env = worker_env(workers, rotating_pool(pgbouncer, 3), AXA_TEST_PREPARE="none")
    jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(20)])
    code, output = finish(workers.start("--burst", "--concurrency", "4", env=env))
    assert code == 0, output
    assert Job.objects.filter(status="completed").count() == 20
    assert "reached through a pooler in transaction mode" in output, output


def test_transaction_pool_with_notify_warns_and_polls(pgbouncer: Start, workers: Workers, log_file: str) -> None:
    proc = workers.start(
        "--concurrency", "4", env=worker_env(workers, pgbouncer("transaction"), AXA_TEST_PREPARE="none")
    )
    batch = jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(20)])
    ids = [job.id for job in batch]
    wait_for(lambda: Job.objects.filter(id__in=ids, status="completed").count() == 20, what="20 jobs drained by polls")
    code, output = stop(proc)
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "PgBouncer" in line and "NOTIFY" in line]
    assert warnings, output


def test_transaction_pool_is_left_without_session_state(pgbouncer: Start, workers: Workers, log_file: str) -> None:
    bouncer = pgbouncer("transaction")
    drain(bouncer, workers, pooler_jobs.pooled_record, log_file, 400, AXA_TEST_POOLING="1")
    used = set(Job.objects.values_list("result", flat=True))  # server pids the jobs ran on
    with ExitStack() as stack:
        # Each client holds a transaction open, so each holds its own server connection:
        # together they hold the whole pool, every connection the workers could have used.
        clients = [stack.enter_context(bouncer.connect(connection.settings_dict["NAME"])) for _ in range(POOL_SIZE)]
        seen = {}
        for conn in clients:
            pid, sync, channels, prepared = conn.execute(
                "SELECT pg_backend_pid(), current_setting('synchronous_commit'),"
                " ARRAY(SELECT pg_listening_channels()), ARRAY(SELECT name FROM pg_prepared_statements)"
            ).fetchone()
            seen[pid] = (sync, channels, prepared)
    assert len(seen) == POOL_SIZE
    assert used & set(seen), (used, seen)
    assert {pid: state for pid, state in seen.items() if state != ("on", [], [])} == {}


ENQUEUE_THROUGH_THE_POOL = """
from django.db import transaction
from tests.testapp import jobs
log = {log!r}
jobs.record.perform_later_many([{{"token": f"a{{i}}", "log": log}} for i in range(2500)])
with transaction.atomic():
    jobs.record.perform_later("one", log)
    jobs.record.perform_later_many([{{"token": f"b{{i}}", "log": log}} for i in range(2500)])
try:
    with transaction.atomic():
        jobs.record.perform_later_many([{{"token": f"gone{{i}}", "log": log}} for i in range(2500)])
        raise RuntimeError("rolled back")
except RuntimeError:
    pass
print("enqueued")
"""


def test_bulk_enqueues_by_copy_through_a_transaction_pool_commit_and_roll_back_with_their_transaction(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    # A Django app behind a transaction pool: its bulk enqueues go in by COPY, in and out
    # of atomic(), and a worker behind the same pool runs each job once.
    bouncer = pgbouncer("transaction")
    env = worker_env(workers, bouncer, AXA_TEST_POOLING="1")
    script = ENQUEUE_THROUGH_THE_POOL.format(log=log_file)
    done = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "enqueued" in done.stdout, done.stdout + done.stderr
    assert Job.objects.count() == 5001
    procs = [workers.start("--burst", "--concurrency", "4", env=env) for _ in range(2)]
    for proc in procs:
        code, output = finish(proc)
        assert code == 0, output
    runs = Counter(Path(log_file).read_text().split())
    assert len(runs) == 5001 and set(runs.values()) == {1}, [t for t, n in runs.items() if n > 1][:10]
    assert not [token for token in runs if token.startswith("gone")]
