"""The benchmark's workloads run through django-tasks-db, the ORM backend of Django's Tasks framework.

Run by ``benchmarks/run.py --peer django-tasks-db`` in a process of its own (Django is set up
once per process, with ``benchmarks.peer_settings``); it writes its figures as JSON to --out.
The peer's worker is ``db_worker``: one task at a time per process, no threads. Drain rates come
from the peer's own timestamps (first ``started_at`` to last ``finished_at``), pickup latency
from ``started_at - enqueued_at``, both set by Python's clock on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import manage, sql, wait_until  # noqa: E402

TABLE = "django_tasks_database_dbtaskresult"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--single", type=int, default=3000)
    parser.add_argument("--drain", type=int, default=10_000)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--latency-gap", type=float, default=0.02)
    parser.add_argument("--interval", type=float, default=1.0, help="db_worker --interval")
    parser.add_argument("--fast-interval", type=float, default=0.0, help="a second latency run at this interval")
    parser.add_argument("--skip", action="append", default=[], choices=["enqueue", "drain", "latency"])
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def reset() -> None:
    sql(f"TRUNCATE {TABLE}")


def db_worker(*args: str) -> subprocess.Popen[bytes]:
    """Start ``manage.py db_worker`` with the peer settings (and this process's CONN_MAX_AGE)."""
    return manage("benchmarks.peer_settings", "db_worker", "--no-startup-delay", "--verbosity", "0", *args)


def succeeded() -> int:
    return sql(f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'")[0][0]


def bench_enqueue(args: argparse.Namespace, results: dict[str, Any]) -> None:
    from benchmarks.peerapp.tasks import noop

    reset()
    start = time.perf_counter()
    for _ in range(args.single):
        noop.enqueue()
    results["enqueue_single_per_s"] = args.single / (time.perf_counter() - start)
    reset()


def fill(count: int) -> None:
    """Write ``count`` ready no-op tasks with bulk_create (setup only: the peer has no bulk enqueue API)."""
    from django_tasks_db.models import DBTaskResult, get_date_max

    from benchmarks.peerapp.tasks import noop

    rows = [
        DBTaskResult(
            id=uuid.uuid4(),
            args_kwargs={"args": [], "kwargs": {}},
            priority=noop.priority,
            task_path=noop.module_path,
            queue_name=noop.queue_name,
            run_after=get_date_max(),
            backend_name="default",
        )
        for _ in range(count)
    ]
    DBTaskResult.objects.bulk_create(rows, batch_size=5000)


def bench_drain(args: argparse.Namespace, results: dict[str, Any], processes: int) -> None:
    reset()
    fill(args.drain)
    sql(f"VACUUM ANALYZE {TABLE}")
    start = time.perf_counter()
    procs = [db_worker("--batch", "--interval", str(args.interval)) for _ in range(processes)]
    for proc in procs:
        proc.wait(timeout=3600)
    wall = time.perf_counter() - start
    done, span = sql(
        f"SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM {TABLE} "
        "WHERE status = 'SUCCESSFUL'"
    )[0]
    if done != args.drain:
        raise SystemExit(f"benchmark (peer): drained {done} of {args.drain}")
    results[f"drain_{processes}_process_per_s"] = done / float(span)
    results[f"drain_{processes}_process_wall_s"] = wall
    reset()


def bench_latency(args: argparse.Namespace, results: dict[str, Any], interval: float, suffix: str) -> None:
    from benchmarks.peerapp.tasks import noop

    reset()
    proc = db_worker("--interval", str(interval))
    # The peer has no worker table: a first task run tells that the worker is up.
    noop.enqueue()
    wait_until(lambda: succeeded() == 1, 60, "db_worker to start")
    sql(f"DELETE FROM {TABLE}")
    time.sleep(0.5)  # let it settle into its idle wait, as the axa run does
    for _ in range(args.latency_jobs):
        noop.enqueue()
        time.sleep(args.latency_gap)
    wait_until(lambda: succeeded() == args.latency_jobs, 120, "latency tasks")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    delays = sorted(
        float(row[0]) * 1000 for row in sql(f"SELECT extract(epoch FROM started_at - enqueued_at) FROM {TABLE}")
    )
    q = statistics.quantiles(delays, n=100, method="inclusive")
    for pct in (50, 95, 99):
        results[f"pickup_p{pct}_ms{suffix}"] = q[pct - 1]
    reset()


def main() -> None:
    args = parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.peer_settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import django_tasks_db

    results: dict[str, Any] = {
        "package": f"django-tasks-db {django_tasks_db.__version__}, Django {django.get_version()}",
        "conn_max_age": settings.DATABASES["default"].get("CONN_MAX_AGE", 0),
        "interval_s": args.interval,
    }
    if "enqueue" not in args.skip:
        bench_enqueue(args, results)
    if "drain" not in args.skip:
        bench_drain(args, results, 1)
        bench_drain(args, results, 2)
    if "latency" not in args.skip:
        bench_latency(args, results, args.interval, "")
        if args.fast_interval:
            results["fast_interval_s"] = args.fast_interval
            bench_latency(args, results, args.fast_interval, "_fast")
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
