#!/usr/bin/env python
"""Benchmark axa-django against one PostgreSQL and print the figures (never asserted).

Measures enqueue (one at a time, bulk), drain of no-op jobs by one and two
``runworker`` processes, pickup latency of an idle worker, and claim time on an empty
table versus one with 1,000,000 finished rows and 100,000 ready rows of other names.
Uses DATABASE_URL, or an embedded PostgreSQL kept under benchmarks/.data.
"""

from __future__ import annotations

import argparse
import importlib.util
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

from benchmarks.common import manage, sql, wait_until  # noqa: E402


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
    parser.add_argument("--peer", choices=["django-tasks-db"], help="also run the workloads through this peer")
    parser.add_argument(
        "--peer-interval",
        type=float,
        default=1.0,
        help="db_worker --interval for the peer's latency run (default 1.0: db_worker's default and our POLL_INTERVAL)",
    )
    parser.add_argument(
        "--peer-fast-interval",
        type=float,
        default=0.1,
        help="a second peer latency run with this shorter --interval (default 0.1; 0 skips it)",
    )
    parser.add_argument(
        "--no-peer-persistent",
        action="store_true",
        help="skip the second peer run with persistent connections (CONN_MAX_AGE=None)",
    )
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "latest.json"), help="output file")
    return parser.parse_args()


def check_peer(peer: str) -> None:
    """Exit with the install command unless the peer and what it needs are here."""
    problem = None
    if sys.version_info < (3, 12):
        problem = f"it needs Python >= 3.12 (this is {platform.python_version()})"
    elif importlib.util.find_spec("django_tasks_db") is None:
        problem = "it is not installed"
    else:
        import django

        if django.VERSION < (6, 0):
            problem = f"it needs Django >= 6.0 (this is {django.get_version()})"
    if problem:
        raise SystemExit(
            f"benchmark: cannot run the peer {peer}: {problem}.\n"
            f'Install it with: pip install -e ".[bench]"  (on Python >= 3.12)'
        )


def setup_database(peer: bool = False) -> str:
    """Create fresh databases axa_bench (and axa_bench_peer) on the server and point Django at axa_bench."""
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
        if peer:
            conn.execute("DROP DATABASE IF EXISTS axa_bench_peer WITH (FORCE)")
            conn.execute("CREATE DATABASE axa_bench_peer")
        version = conn.execute("SHOW server_version").fetchone()[0]
    url = os.environ["DATABASE_URL"]
    head, _, query = url.partition("?")
    head = head.rsplit("/", 1)[0] + "/axa_bench"
    os.environ["DATABASE_URL"] = head + ("?" + query if query else "")
    parse_url(os.environ["DATABASE_URL"])
    return version


def reset() -> None:
    sql("TRUNCATE axa_queue, axa_worker")


def worker(*args: str) -> subprocess.Popen[bytes]:
    return manage("benchmarks.settings", "runworker", *args)


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
        params = {
            "worker": None,
            "names": ["benchmarks.benchapp.jobs.noop"],
            "backends": [],
            "limit": 4,
            "queues": None,
        }
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


PEER_CONFIGS = {"default": "0", "persistent": "none"}  # BENCH_PEER_CONN_MAX_AGE of each peer run


def bench_peer(args: argparse.Namespace, config: str) -> dict[str, Any]:
    """Run benchmarks/peer.py (its own process: Django is set up with the peer's settings) and read its JSON."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        command = [
            sys.executable,
            str(ROOT / "benchmarks" / "peer.py"),
            "--single",
            str(args.single),
            "--drain",
            str(args.drain),
            "--latency-jobs",
            str(args.latency_jobs),
            "--latency-gap",
            str(args.latency_gap),
            "--interval",
            str(args.peer_interval),
            "--fast-interval",
            str(args.peer_fast_interval),
            "--out",
            str(out),
        ]
        for skipped in args.skip:
            if skipped != "claim":
                command += ["--skip", skipped]
        env = dict(os.environ, BENCH_PEER_CONN_MAX_AGE=PEER_CONFIGS[config])
        env.pop("DJANGO_SETTINGS_MODULE", None)
        subprocess.run(command, cwd=ROOT, env=env, check=True)
        return json.loads(out.read_text())


def peer_ratios(results: dict[str, Any]) -> None:
    """Add axa/peer for rates and peer/axa for latencies (bigger is better for axa in both)."""
    peer = results["peer"]
    for config in PEER_CONFIGS:
        if config not in peer:
            continue
        ratios = {}
        for key, *_ in PEER_ROWS:
            axa_key = key.removesuffix("_fast")
            if key in peer[config] and results.get(axa_key):
                a, b = results[axa_key], peer[config][key]
                ratios[key] = b / a if key.startswith("pickup") else a / b
        peer[config]["ratios"] = ratios


def main() -> None:
    args = parse_args()
    if args.peer:
        check_peer(args.peer)
    version = setup_database(peer=bool(args.peer))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "postgresql": version,
        "concurrency": args.concurrency,
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
    if args.peer:
        results["peer"] = {"name": args.peer}
        for config in PEER_CONFIGS:
            if config == "persistent" and args.no_peer_persistent:
                continue
            print(f"running the peer {args.peer}, {config} connections ...", file=sys.stderr)
            results["peer"][config] = bench_peer(args, config)
        peer_ratios(results)
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
# Peer figures: (peer key, label); the axa figure is the key without "_fast".
PEER_ROWS = [
    ("enqueue_single_per_s", "enqueue, one at a time"),
    ("enqueue_bulk_per_s", "enqueue, bulk"),
    ("drain_1_process_per_s", "drain, 1 worker process"),
    ("drain_2_process_per_s", "drain, 2 worker processes"),
    ("pickup_p50_ms", "pickup latency p50"),
    ("pickup_p95_ms", "pickup latency p95"),
    ("pickup_p99_ms", "pickup latency p99"),
    ("pickup_p50_ms_fast", "pickup latency p50, peer --interval {fast}"),
    ("pickup_p95_ms_fast", "pickup latency p95, peer --interval {fast}"),
    ("pickup_p99_ms_fast", "pickup latency p99, peer --interval {fast}"),
]


def report(results: dict[str, Any]) -> None:
    print(f"machine: {results['machine']}; PostgreSQL {results['postgresql']}")
    print(f"{'metric':<42} {'value':>12}  {'unit':<7} target")
    for key, label, unit, target in ROWS:
        if key in results:
            print(f"{label:<42} {results[key]:>12,.2f}  {unit:<7} {target}")
    if "claim_big_ms" in results and results.get("claim_empty_ms"):
        print(f"{'claim ratio big/empty':<42} {results['claim_big_ms'] / results['claim_empty_ms']:>12.2f}")
    if "peer" in results:
        report_peer(results)


def report_peer(results: dict[str, Any]) -> None:
    peer = results["peer"]
    configs = [config for config in PEER_CONFIGS if config in peer]
    if not configs:
        return
    first = peer[configs[0]]
    fast = first.get("fast_interval_s")
    print(f"\naxa-django vs {first['package']}, same server, same run")
    print(f"  axa:  runworker --concurrency {results['concurrency']} (--burst for the drain), NOTIFY wake-up, poll 1 s")
    print(
        f"  peer: db_worker, one task at a time per process (--batch for the drain), "
        f"polls every --interval {first['interval_s']:g} s" + (f" (and {fast:g} s)" if fast else "")
    )
    print("  ratio = axa/peer for rates and peer/axa for latencies (*): bigger is better for axa in every row")
    headers = {"default": "peer CONN_MAX_AGE=0", "persistent": "peer CONN_MAX_AGE=None"}
    line = f"{'metric':<46} {'unit':<7} {'axa':>10}"
    for config in configs:
        line += f" | {headers[config]:>22} {'ratio':>8}"
    print(line)
    for key, label in PEER_ROWS:
        axa_key = key.removesuffix("_fast")
        if key.endswith("_fast") and not fast:
            continue
        if axa_key not in results:
            continue
        unit = "ms" if key.startswith("pickup") else "jobs/s"
        star = "*" if key.startswith("pickup") else ""
        line = f"{label.format(fast=f'{fast:g}' if fast else ''):<46} {unit:<7} {results[axa_key]:>10,.1f}"
        for config in configs:
            value = peer[config].get(key)
            ratio = peer[config]["ratios"].get(key)
            if value is None:
                note = "n/a (no bulk API)" if key == "enqueue_bulk_per_s" else "-"
                line += f" | {note:>22} {'':>8}"
            else:
                line += f" | {value:>22,.1f} {f'{ratio:,.1f}x{star}':>8}"
        print(line)


if __name__ == "__main__":
    main()
