"""Run one benchmark phase of one tool, in that tool's own venv, and write its figures as JSON.

``python benchmarks/driver.py --tool NAME --phase PHASE ...`` is started by benchmarks/run.py;
``benchmarks/peers/<tool>_peer.py`` says how the tool enqueues and which command is its worker.
Drain and pickup figures come from the jobs' own records (benchmarks/measure.py), never from
the tool's tables, so every tool is timed the same way.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402
from benchmarks.peers.base import Tool  # noqa: E402

MODULES = {
    "axa": "benchmarks.peers.axa_peer",
    "axa-throughput": "benchmarks.peers.axa_peer",  # run.py passes its runworker arguments
    "pgqueuer": "benchmarks.peers.pgqueuer_peer",
    "procrastinate": "benchmarks.peers.procrastinate_peer",
    "django-tasks-db": "benchmarks.peers.dtdb_peer",
    "graphile-worker": "benchmarks.peers.graphile_peer",
    "graphile-worker-tuned": "benchmarks.peers.graphile_tuned_peer",
}
WARMUP = 90_000_000  # ids of the jobs that tell a worker is up; never counted


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool", required=True, choices=sorted(MODULES))
    parser.add_argument("--phase", required=True, choices=["setup", "single", "bulk", "fill", "drain", "latency"])
    parser.add_argument("--n", type=int, default=0, help="jobs")
    parser.add_argument("--processes", type=int, default=1, help="worker processes for the drain")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between the latency run's jobs")
    parser.add_argument("--pg-pid", type=int, default=0, help="the local PostgreSQL server's postmaster, for its CPU")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def start_workers(tool: Tool, count: int, record: Path) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, BENCH_RECORD=str(record), PYTHONPATH=str(ROOT))
    command = tool.worker_command()
    return [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(count)
    ]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def drain(tool: Tool, args: argparse.Namespace, record: Path) -> dict[str, Any]:
    """Start the workers on ``--n`` ready jobs (``fill`` wrote them) and time them from the jobs' records."""
    spawned = time.time()
    procs = start_workers(tool, args.processes, record)
    pids = [p.pid for p in procs]
    try:
        measure.wait_until(lambda: measure.recorded(record) > 0, 120, "the first job")
        before, done_before = measure.Sample(pids, args.pg_pid), measure.recorded(record)
        measure.wait_until(lambda: measure.recorded(record) >= args.n, 1800, f"{args.n} jobs", step=0.02)
        after = measure.Sample(pids, args.pg_pid)
        time.sleep(0.2)  # a duplicate run would show up here
    finally:
        stop(procs)
    runs = measure.read_records(record, range(args.n))
    span = runs.last_end - runs.first_start
    return {
        "per_s": args.n / span,
        "span_s": span,
        "startup_s": runs.first_start - spawned,
        "duplicates": runs.duplicates,
        "missing": runs.missing,
        **measure.cpu_figures(before, after, args.n - done_before),
    }


def latency(tool: Tool, args: argparse.Namespace, record: Path) -> dict[str, Any]:
    """Jobs enqueued every ``--gap`` s to one idle worker: enqueue call start to job start."""
    spawned = time.time()
    procs = start_workers(tool, 1, record)
    try:
        tool.enqueue_paced([WARMUP], 0)
        measure.wait_until(lambda: measure.recorded(record) > 0, 120, "the worker to start")
        started = time.time() - spawned
        time.sleep(0.5)  # let it settle into its idle wait
        sent = tool.enqueue_paced(list(range(args.n)), args.gap)
        measure.wait_until(lambda: measure.recorded(record) >= args.n + 1, 120, "the latency jobs")
        time.sleep(0.2)
    finally:
        stop(procs)
    runs = measure.read_records(record, [WARMUP, *range(args.n)])
    picked = {i: (runs.starts[i] - sent[i]) * 1000 for i in range(args.n) if i in runs.starts}
    delays = sorted(picked.values())
    q = statistics.quantiles(delays, n=100, method="inclusive")
    slowest = max(picked, key=picked.__getitem__)
    return {
        "p50_ms": q[49],
        "p95_ms": q[94],
        "p99_ms": q[98],
        "max_ms": delays[-1],  # the tail's worst: the bound is on every pickup, not a percentile
        # Of it, the enqueue call (its commit: the server's) and the rest (the worker's pickup).
        "max_enqueue_ms": (tool.returned[slowest] - sent[slowest]) * 1000,
        # The slowest of the pickups counted from the enqueue's return, whichever job's.
        "max_after_enqueue_ms": max((runs.starts[i] - tool.returned[i]) * 1000 for i in picked),
        "startup_s": started,
        "duplicates": runs.duplicates,
        "missing": runs.missing,
    }


def enqueue(tool: Tool, args: argparse.Namespace, bulk: bool) -> dict[str, Any]:
    ids = list(range(args.n))
    before = measure.Sample([], args.pg_pid)
    start = time.perf_counter()
    if bulk:
        tool.enqueue_bulk(ids)
    else:
        tool.enqueue_single(ids)
    elapsed = time.perf_counter() - start
    after = measure.Sample([], args.pg_pid)
    return {"per_s": args.n / elapsed, **measure.cpu_figures(before, after, args.n, prefix="enqueue_")}


def main() -> None:
    args = parse_args()
    tool: Tool = importlib.import_module(MODULES[args.tool]).Peer()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="axa-bench-") as tmp:
        record = Path(tmp) / "record"
        if args.phase == "setup":
            tool.setup()
            result = {"version": tool.version()}
        elif args.phase == "single":
            result = enqueue(tool, args, bulk=False)
        elif args.phase == "bulk":
            result = enqueue(tool, args, bulk=True)
        elif args.phase == "fill":
            tool.fill(list(range(args.n)))
        elif args.phase == "drain":
            result = drain(tool, args, record)
        else:
            result = latency(tool, args, record)
    tool.close()
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
