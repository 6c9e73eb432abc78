#!/usr/bin/env python
"""Benchmark axa-django against one PostgreSQL and print the figures (never asserted).

Measures enqueue (one at a time, bulk), drain of no-op jobs by one and two
``runworker`` processes, pickup latency of an idle worker, and claim time on an empty
table versus one with 1,000,000 finished rows and 100,000 ready rows of other names.
Uses DATABASE_URL, or an embedded PostgreSQL kept under benchmarks/.data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=3000, help="jobs enqueued one at a time (default 3000)")
    parser.add_argument("--bulk", type=int, default=100_000, help="jobs enqueued in bulk (default 100000)")
    parser.add_argument("--drain", type=int, default=10_000, help="no-op jobs drained per run (default 10000)")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker process (default 4)")
    parser.add_argument("--latency-jobs", type=int, default=200, help="jobs for the pickup latency run")
    parser.add_argument("--latency-gap", type=float, default=0.02, help="seconds between those jobs")
    parser.add_argument("--finished-rows", type=int, default=1_000_000, help="finished rows for the claim run")
    parser.add_argument("--foreign-rows", type=int, default=100_000, help="ready rows of other names")
    parser.add_argument("--skip", action="append", default=[], choices=["enqueue", "drain", "latency", "claim"])
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "latest.json"), help="output file")
    return parser.parse_args()


def setup_database() -> str:
    """Create a fresh database axa_bench on the server and point Django at it."""
    from axa_django.devdb import database, parse_url

    base = database(ROOT / "benchmarks" / ".data" / "pg", cleanup="stop")
    import psycopg

    with psycopg.connect(
        dbname=base["NAME"],
        user=base["USER"],
        password=base["PASSWORD"],
        host=base["HOST"],
        port=base["PORT"],
        autocommit=True,
    ) as conn:
        conn.execute("DROP DATABASE IF EXISTS axa_bench WITH (FORCE)")
        conn.execute("CREATE DATABASE axa_bench")
        version = conn.execute("SHOW server_version").fetchone()[0]
    url = os.environ["DATABASE_URL"]
    head, _, query = url.partition("?")
    head = head.rsplit("/", 1)[0] + "/axa_bench"
    os.environ["DATABASE_URL"] = head + ("?" + query if query else "")
    parse_url(os.environ["DATABASE_URL"])
    return version


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    sql("TRUNCATE axa_queue, axa_worker")


def worker(*args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="benchmarks.settings")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: timed out waiting for {what}")
        time.sleep(0.01)


def bench_enqueue(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from benchmarks.benchapp.jobs import noop

    reset()
    start = time.perf_counter()
    for _ in range(args.single):
        noop.perform_later()
    results["enqueue_single_per_s"] = args.single / (time.perf_counter() - start)
    reset()
    start = time.perf_counter()
    chunk = 10_000
    for offset in range(0, args.bulk, chunk):
        noop.perform_later_many([{}] * min(chunk, args.bulk - offset))
    results["enqueue_bulk_per_s"] = args.bulk / (time.perf_counter() - start)
    reset()


def bench_drain(args: argparse.Namespace, results: dict[str, Any], processes: int) -> None:
    from benchmarks.benchapp.jobs import noop

    reset()
    noop.perform_later_many([{}] * args.drain)
    sql("VACUUM ANALYZE axa_queue")
    start = time.perf_counter()
    procs = [worker("--concurrency", str(args.concurrency), "--burst") for _ in range(processes)]
    for proc in procs:
        proc.wait(timeout=600)
    wall = time.perf_counter() - start
    done, span = sql(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM axa_queue WHERE status = 'completed'"
    )[0]
    if done != args.drain:
        raise SystemExit(f"benchmark: drained {done} of {args.drain}")
    results[f"drain_{processes}_process_per_s"] = done / float(span)
    results[f"drain_{processes}_process_wall_s"] = wall


def bench_latency(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from benchmarks.benchapp.jobs import noop

    reset()
    proc = worker("--concurrency", str(args.concurrency))
    wait_until(lambda: sql("SELECT count(*) FROM axa_worker")[0][0] == 1, 60, "worker to start")
    time.sleep(0.5)  # let it settle into its idle wait
    for _ in range(args.latency_jobs):
        noop.perform_later()
        time.sleep(args.latency_gap)
    wait_until(
        lambda: sql("SELECT count(*) FROM axa_queue WHERE status = 'completed'")[0][0] == args.latency_jobs,
        60,
        "latency jobs",
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    delays = sorted(
        float(row[0]) * 1000 for row in sql("SELECT extract(epoch FROM started_at - created_at) FROM axa_queue")
    )
    q = statistics.quantiles(delays, n=100, method="inclusive")
    results["pickup_p50_ms"], results["pickup_p95_ms"], results["pickup_p99_ms"] = q[49], q[94], q[98]


def time_claim(reps: int = 300) -> float:
    """Median milliseconds of the worker's CLAIM for one job, rolled back each time."""
    import psycopg

    from axa_django import sql as statements
    from axa_django.worker import connect

    timings = []
    with connect("default", "bench") as conn:
        conn.autocommit = False
        query = statements.CLAIM.format(queues="")
        params = {"worker": None, "names": ["benchmarks.benchapp.jobs.noop"], "limit": 4, "queues": None}
        for _ in range(reps):
            start = time.perf_counter()
            rows = conn.execute(query, params).fetchall()
            timings.append((time.perf_counter() - start) * 1000)
            assert len(rows) == 1, rows
            conn.rollback()
        plan = "\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + psycopg.sql.SQL(query), params))
        conn.rollback()
    return statistics.median(timings), plan


def bench_claim(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from benchmarks.benchapp.jobs import noop

    reset()
    noop.perform_later()
    sql("VACUUM ANALYZE axa_queue")
    results["claim_empty_ms"], _ = time_claim()
    sql(
        "INSERT INTO axa_queue (id, name, args, status, run_at, finished_at) "
        "SELECT gen_random_uuid(), 'benchmarks.benchapp.jobs.noop', '{}', "
        "CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END, now() - interval '1 day', now() "
        "FROM generate_series(1, %s) AS i",
        [args.finished_rows],
    )
    sql(
        "INSERT INTO axa_queue (id, name, args, run_at) "
        "SELECT gen_random_uuid(), 'other.service.job', '{}', now() - interval '1 hour' "
        "FROM generate_series(1, %s)",
        [args.foreign_rows],
    )
    sql("VACUUM ANALYZE axa_queue")
    results["claim_big_ms"], plan = time_claim()
    results["claim_big_plan"] = plan
    reset()


def main() -> None:
    args = parse_args()
    version = setup_database()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "postgresql": version,
    }
    if "enqueue" not in args.skip:
        bench_enqueue(args, results)
    if "drain" not in args.skip:
        bench_drain(args, results, 1)
        bench_drain(args, results, 2)
    if "latency" not in args.skip:
        bench_latency(args, results)
    if "claim" not in args.skip:
        bench_claim(args, results)
    report(results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


ROWS = [
    ("enqueue_single_per_s", "enqueue, one at a time", "jobs/s", ">= 2,000"),
    ("enqueue_bulk_per_s", "enqueue, bulk", "jobs/s", ">= 30,000"),
    ("drain_1_process_per_s", "drain, 1 runworker process", "jobs/s", ">= 3,000"),
    ("drain_2_process_per_s", "drain, 2 runworker processes", "jobs/s", ""),
    ("pickup_p50_ms", "pickup latency p50", "ms", "<= 3"),
    ("pickup_p95_ms", "pickup latency p95", "ms", ""),
    ("pickup_p99_ms", "pickup latency p99", "ms", "<= 20"),
    ("claim_empty_ms", "claim, empty table", "ms", ""),
    ("claim_big_ms", "claim, 1M finished + 100k foreign ready", "ms", "<= 2x empty"),
]


def report(results: dict[str, Any]) -> None:
    print(f"machine: {results['machine']}; PostgreSQL {results['postgresql']}")
    print(f"{'metric':<42} {'value':>12}  {'unit':<7} target")
    for key, label, unit, target in ROWS:
        if key in results:
            print(f"{label:<42} {results[key]:>12,.2f}  {unit:<7} {target}")
    if "claim_big_ms" in results and results.get("claim_empty_ms"):
        print(f"{'claim ratio big/empty':<42} {results['claim_big_ms'] / results['claim_empty_ms']:>12.2f}")


if __name__ == "__main__":
    main()
