"""benchmarks/run.py and benchmarks/soak.py run end to end for axa alone, at tiny sizes (figures never asserted)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT, database_url


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_the_benchmark_runs_and_counts_every_job_once(tmp_path):
    prefix = f"{connection.settings_dict['NAME']}_bench_"
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = tmp_path / "bench.json"
    command = [sys.executable, "benchmarks/run.py", "--drain", "50", "--latency-jobs", "10", "--skip", "single"]
    command += ["--latency-gap", "0.01", "--skip", "bulk", "--skip", "drain2", "--skip", "claim"]
    command += ["--idle-timeout", "0", "--db-prefix", prefix, "--json", str(out), "--shapes", "names:3"]
    result = _run_then_drop(command, env, f"{prefix}axa")
    assert result.returncode == 0, result.stdout + result.stderr
    header = result.stdout.splitlines()[1]
    assert "fsync=" in header and "synchronous_commit=" in header, header
    assert "TCP " in header or "Unix socket" in header, header
    runs = json.loads(out.read_text())["runs"]["axa"]
    assert set(runs) == {"drain1", "latency", "drain names:3"}
    for phase in ("drain1", "latency", "drain names:3"):
        assert runs[phase][0]["duplicates"] == 0 and runs[phase][0]["missing"] == 0, runs[phase]
    assert runs["drain1"][0]["per_s"] > 0 and runs["latency"][0]["p99_ms"] > 0
    latency = runs["latency"][0]
    # The slowest pickup told apart: its enqueue call is a part of it, never more.
    assert 0 < latency["max_enqueue_ms"] < latency["max_ms"], latency
    assert 0 < latency["max_after_enqueue_ms"] <= latency["max_ms"], latency
    assert "duplicates 0, missing 0" in result.stdout
    assert re.search(r"axa +names:3 jobs/s [\d.]+x", result.stdout), result.stdout


def _soak(prefix: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "benchmarks/soak.py", "--interval", "1", "--rate", "100", "--batch", "5"]
    command += ["--db-prefix", prefix, *extra]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM first, so the soak stops its worker and producer; SIGKILL only if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_then_drop(command: list[str], env: dict[str, str], database: str) -> subprocess.CompletedProcess[str]:
    """Run a benchmark script; drop the database it made, however it ended."""
    try:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        _drop(database)


def _database_exists(name: str) -> bool:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def _drop(name: str) -> None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


INTERVAL_LINE = re.compile(
    r"^\s+\d+ +[\d,]+ +[\d,]+ +[\d,]+ +[\d.,-]+ +[\d.,-]+ +[\d,]+ +[\d.]+ +[\d.]+ +[\d,]+ +[\d.]+ +[\d.,-]+ +[\d.]+/[\d.]+"
    r" +(warmup|held|open|drain)$"
)


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_the_soak_prints_its_lines_and_counts_every_job_once(tmp_path):
    prefix = f"{connection.settings_dict['NAME']}_soak_"
    out = tmp_path / "soak.json"
    args = ["--minutes", "0.05", "--warmup", "1", "--hold-snapshot", "--release-at", "2"]
    proc = _soak(prefix, *args, "--drain-timeout", "20", "--json", str(out))
    try:
        stdout, _ = proc.communicate(timeout=90)
        left = _database_exists(f"{prefix}axa")  # before the clean-up below
    finally:
        _stop(proc)
        _drop(f"{prefix}axa")
    assert proc.returncode == 0, stdout
    lines = stdout.splitlines()
    server = next(line for line in lines if line.startswith("server: "))
    assert "fsync=" in server and "synchronous_commit=" in server, server
    timed = [line for line in lines if INTERVAL_LINE.match(line) and not line.endswith("drain")]
    assert [line.split()[0] for line in timed] == ["1", "2", "3"], stdout
    assert timed[0].endswith("warmup") and timed[1].endswith("held") and timed[2].endswith("open"), stdout
    assert any("snapshot held: BEGIN ISOLATION LEVEL REPEATABLE READ" in line for line in lines), stdout
    summary = next(line for line in lines if " vs first " in line)
    for part in (
        "pickup p50",
        "buffers per claim",
        "entries per index scan",
        "backlog at end",
        "drained/enqueued",
        "released at 2 s",
    ):
        assert part in summary, summary
    assert re.search(r"cpu per job, 1-3 s \([\d,]+ jobs\): worker [\d.]+ ms; PostgreSQL ([\d.]+ ms|n/a)", stdout), (
        stdout
    )
    check = next(line for line in lines if line.startswith("check: "))
    assert "duplicates 0, missing 0" in check, check
    result = json.loads(out.read_text())
    assert result["check"]["enqueued"] == result["check"]["ran"] == result["check"]["rows"] > 0, result["check"]
    assert result["check"]["completed"] == result["check"]["rows"], result["check"]
    intervals = result["intervals"]
    assert all(i["claim_buffers"] > 0 and i["index_bytes"] > 0 for i in intervals), intervals
    assert sum(i["pickups"] for i in intervals) > 0 and all(i["p50_ms"] > 0 for i in intervals if i["pickups"])
    assert not left, "the soak left its database behind"


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_an_interrupted_soak_stops_its_worker_and_drops_its_database():
    prefix = f"{connection.settings_dict['NAME']}_soakint_"
    proc = _soak(prefix, "--minutes", "1", "--warmup", "10", "--json", os.devnull)
    worker = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            found = re.search(r"worker pid (\d+)", line)
            worker = int(found.group(1)) if found else worker
            if INTERVAL_LINE.match(line):
                break
        assert worker is not None, "no worker pid printed"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        left = _database_exists(f"{prefix}axa")  # before the clean-up below
    finally:
        _stop(proc)
        _drop(f"{prefix}axa")
    assert proc.returncode == 130, rest
    assert "interrupted" in rest, rest
    assert not left, "the interrupted soak left its database behind"
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_the_console_benchmark_loads_every_page_and_search_form():
    name = f"{connection.settings_dict['NAME']}_console"
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "benchmarks/console.py", "--url", database_url(), "--db", name]
    command += ["--rows", "2000", "--queued", "100", "--reps", "1"]
    result = _run_then_drop(command, env, name)
    assert result.returncode == 0, result.stdout + result.stderr
    timed = [line for line in result.stdout.splitlines() if re.search(r" [\d.]+ +[\d.]+ +[\d.]+$", line)]
    assert len(timed) == 23, result.stdout
    assert "built the opt-in arguments index" in result.stdout


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_the_history_benchmark_prints_each_figure_on_a_small_and_a_large_history():
    name = f"{connection.settings_dict['NAME']}_history"
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "benchmarks/history.py", "--url", database_url(), "--db", name]
    command += ["--rows", "3000", "--base-rows", "300", "--ready", "40", "--reps", "2"]
    result = _run_then_drop(command, env, name)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = [line for line in result.stdout.splitlines() if re.search(r"\d\.\d\dx$", line)]
    assert len(figures) == 9, result.stdout
    assert "filled 3,000 finished rows" in result.stdout
    assert re.search(
        r"retention: the history table closed in [\d.]+ ms, and its 3,000 rows dropped whole in [\d.]+ ms "
        r"\(0 finished rows left\)",
        result.stdout,
    ), result.stdout


@pytest.mark.django_db(transaction=True)
def test_the_ceiling_runs_the_workers_statements_in_pgbench_and_every_row_ends_once(tmp_path):
    if shutil.which("pgbench") is None:
        pytest.skip("pgbench is not installed (apt-get install postgresql-client)")
    database = f"{connection.settings_dict['NAME']}_ceiling"
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    script = tmp_path / "ceiling.sql"
    command = [sys.executable, "benchmarks/ceiling.py", "--jobs", "600", "--batch", "64", "--clients", "1,2"]
    command += ["--db", database, "--keep", str(script)]
    result = _run_then_drop(command, env, database)
    assert result.returncode == 0, result.stdout + result.stderr
    # The figures are the script's; its own check (every row completed once in the history) passed.
    assert re.search(r"^1 client\(s\): [\d,]+ jobs/s", result.stdout, re.M), result.stdout
    assert re.search(r"^2 client\(s\): [\d,]+ jobs/s", result.stdout, re.M), result.stdout
    assert "FOR UPDATE SKIP LOCKED" in script.read_text() and "axa_history" in script.read_text()


def test_the_spread_benchmark_drains_each_shape_with_its_processes_once_each():
    database = f"{connection.settings_dict['NAME']}_spread"
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "benchmarks/spread.py", "--jobs", "200", "--rounds", "1", "--db", database]
    command += ["--shapes", "names:20x10", "--processes", "2"]  # the other shapes differ in their INSERT only
    command += ["--start-first", "--worker-args", "--concurrency 1"]  # started on the empty table, then the rows
    result = _run_then_drop(command, env, database)
    # Its own check passed: every row completed, none run twice.
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line.split() for line in result.stdout.splitlines() if re.match(r"(names|priorities|queues):", line)]
    assert [(line[0], line[1], line[2]) for line in lines] == [("names:20x10", "2", "200")], result.stdout


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_the_spread_benchmark_drains_through_a_transaction_pool(pgbouncer):
    bouncer = pgbouncer("transaction", pool_size=2)
    database = f"{connection.settings_dict['NAME']}_spreadpool"
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "benchmarks/spread.py", "--jobs", "200", "--rounds", "1", "--db", database]
    command += ["--shapes", "names:1x200", "--processes", "2", "--start-first", "--worker-args", "--concurrency 1"]
    command += ["--pooler", f"{bouncer.port}:{bouncer.proc.pid}"]
    result = _run_then_drop(command, env, database)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = [line.split() for line in result.stdout.splitlines() if line.startswith("names:")]
    assert line[:3] == ["names:1x200", "2", "200"], result.stdout
    # Two workers hold 8 connections of their own; through the pool the server saw at most its 2
    # and the harness's own.
    assert int(line[7]) <= 4, result.stdout
