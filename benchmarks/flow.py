#!/usr/bin/env python
"""Concurrency limits against none, on the database DATABASE_URL names (migrated here); figures printed, never asserted.

W workers x T threads drain N jobs of S seconds: without limits, then with
``concurrency=1`` (and ``concurrency=3``) over K keys. Each run prints its drain time
(first enqueue to last end), its ratio to the unlimited drain, and the most jobs of one
key seen running at once (from the jobs' own start and end times).

    DATABASE_URL=postgresql://.../axa_bench_flow python benchmarks/flow.py [--jobs 1200 --keys 1200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1200)
    parser.add_argument("--keys", type=int, default=1200, help="distinct concurrency keys")
    parser.add_argument("--seconds", type=float, default=0.005, help="each job's run time")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="axa-flow-")) / "log"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    os.environ["BENCH_FLOW_LOG"] = str(log)
    os.environ["BENCH_FLOW"] = "1"  # installs benchmarks.flowapp, here and in the workers
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from benchmarks.common import sql, start_workers, wait
    from benchmarks.flowapp import jobs

    kinds = {"none": jobs.work, "concurrency=1": jobs.work_one_per_key, "concurrency=3": jobs.work_three_per_key}
    limits = {"none": None, "concurrency=1": 1, "concurrency=3": 3}
    sql("TRUNCATE axa_queue, axa_worker")
    # Statistics as of a queue with a backlog of each kind: with none queued at ANALYZE,
    # the planner takes the seed's ready index for the claims' walks (see docs/performance.md).
    for job in kinds.values():
        job.perform_later_many([{"i": i, "key": f"k{i % args.keys}", "seconds": 0} for i in range(args.jobs)])
    sql("ANALYZE axa_queue")
    sql("TRUNCATE axa_queue")
    procs = start_workers(args.workers, args.threads)
    times: dict[str, list[float]] = defaultdict(list)
    try:
        time.sleep(3)  # let them connect and go idle
        for _ in range(args.rounds):
            for kind, job in kinds.items():
                log.unlink(missing_ok=True)
                sql("TRUNCATE axa_queue")
                calls = [{"i": i, "key": f"k{i % args.keys}", "seconds": args.seconds} for i in range(args.jobs)]
                start = time.time()
                job.perform_later_many(calls)
                wait(lambda: count(log) >= args.jobs)
                spans = read(log)
                # The outcomes are written just after the jobs end: let them land before the next TRUNCATE.
                wait(lambda: sql("SELECT count(*) FROM axa_queue WHERE status <> 'completed'")[0][0] == 0)
                seconds = max(end for _, _, end in spans) - start
                times[kind].append(seconds)
                peak = most_at_once(spans)
                ran = len(spans)
                limit = limits[kind]
                print(
                    f"{kind:>14}: {seconds:.3f}s ({args.jobs / seconds:,.0f} jobs/s), ran {ran}/{args.jobs}, "
                    f"most of one key at once {peak}" + ("" if limit is None else f" (limit {limit})"),
                    flush=True,
                )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    base = statistics.median(times["none"])
    for kind, found in times.items():
        median = statistics.median(found)
        print(f"median {kind:>14}: {median:.3f}s, {median / base:.2f}x the unlimited drain")


def count(log: Path) -> int:
    try:
        return len(log.read_text().splitlines())
    except FileNotFoundError:
        return 0


def read(log: Path) -> list[tuple[str, float, float]]:
    spans = []
    for line in log.read_text().splitlines():
        _, key, start, end = line.split(" ")
        spans.append((key, float(start), float(end)))
    return spans


def most_at_once(spans: list[tuple[str, float, float]]) -> int:
    by_key: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for key, start, end in spans:
        by_key[key] += [(start, 1), (end, -1)]
    peak = 0
    for events in by_key.values():
        running = 0
        for _, step in sorted(events):  # an end at the same instant as a start sorts first
            running += step
            peak = max(peak, running)
    return peak


if __name__ == "__main__":
    main()
