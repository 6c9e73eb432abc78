#!/usr/bin/env python
"""Workflows against plain jobs, on the database DATABASE_URL names (migrated here); figures printed, never asserted.

- enqueue: N jobs in one perform_later_many, plain and as children of one ``after=`` parent;
- claim: the worker's CLAIM with N waiting rows in the table and with none;
- drain: N no-op jobs by W workers x T threads, plain, and as a fan-out from one parent
  with a fan-in after all of them (and the time from the last child's end to the fan-in's start).

    DATABASE_URL=postgresql://.../axa_bench_workflow python benchmarks/workflows.py [--jobs 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from benchmarks.benchapp.jobs import noop
    from benchmarks.common import sql, start_workers, wait

    n = args.jobs

    def clean() -> None:
        sql("TRUNCATE axa_queue, axa_worker, axa_dependency, axa_workflow")

    clean()
    noop.using(after=[noop.perform_later()]).perform_later_many([{} for _ in range(100)])  # warm up
    clean()
    start = time.perf_counter()
    noop.perform_later_many([{} for _ in range(n)])
    plain = time.perf_counter() - start
    clean()
    root = noop.perform_later()
    start = time.perf_counter()
    noop.using(after=[root]).perform_later_many([{} for _ in range(n)])
    children = time.perf_counter() - start
    print(
        f"enqueue {n}: plain {plain:.3f}s ({n / plain:,.0f} jobs/s); "
        f"with one after= {children:.3f}s ({n / children:,.0f} jobs/s)"
    )

    print(f"claim median: {claim_ms():.3f} ms with {n} waiting rows", end="")
    clean()
    noop.perform_later()
    sql("VACUUM ANALYZE axa_queue")
    print(f", {claim_ms():.3f} ms with none")

    clean()
    procs = start_workers(args.workers, args.threads)
    try:
        time.sleep(3)  # let them connect and go idle
        start = time.perf_counter()
        noop.perform_later_many([{} for _ in range(n)])
        wait(lambda: sql("SELECT count(*) FROM axa_queue WHERE status = 'completed'")[0][0] == n)
        plain_drain = time.perf_counter() - start
        clean()
        start = time.perf_counter()
        root = noop.perform_later()
        kids = noop.using(after=[root]).perform_later_many([{} for _ in range(n)])
        fan_in = noop.using(after=kids).perform_later()
        wait(lambda: sql("SELECT status FROM axa_queue WHERE id = %s", [fan_in.pk])[0][0] == "completed")
        fan_drain = time.perf_counter() - start
        [(lag,)] = sql(
            "SELECT extract(epoch FROM f.started_at - (SELECT max(finished_at) FROM axa_queue "
            "WHERE id <> %s AND id <> %s)) FROM axa_queue f WHERE f.id = %s",
            [fan_in.pk, root.pk, fan_in.pk],
        )
        [(runs,)] = sql("SELECT sum(attempts) FROM axa_queue")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    print(
        f"drain {n} by {args.workers} workers x {args.threads} threads: plain {plain_drain:.2f}s "
        f"({n / plain_drain:,.0f} jobs/s); fan-out + fan-in (enqueue included) {fan_drain:.2f}s "
        f"({(n + 2) / fan_drain:,.0f} jobs/s); last child to fan-in start {float(lag) * 1000:.0f} ms; "
        f"attempts {runs} for {n + 2} jobs"
    )


def claim_ms(reps: int = 200) -> float:
    """Median milliseconds of the worker's CLAIM of one ready job, rolled back each time."""
    from axa_django import sql as statements
    from axa_django.worker import connect
    from benchmarks.common import sql

    sql("INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'benchmarks.benchapp.jobs.noop', '{}')")
    sql("VACUUM ANALYZE axa_queue")
    timings = []
    with connect("default", "bench") as conn:
        conn.autocommit = False
        query = statements.compose(statements.CLAIM, ["benchmarks.benchapp.jobs.noop"], [], None)
        for _ in range(reps):
            start = time.perf_counter()
            conn.execute(query, {"worker": None, "limit": 4, "ahead": False}).fetchall()
            timings.append((time.perf_counter() - start) * 1000)
            conn.rollback()
    return statistics.median(timings)


if __name__ == "__main__":
    main()
