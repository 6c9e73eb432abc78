"""A bulk retry of every failed job beside a draining worker, on the database benchmarks/console.py --keep left.

    python benchmarks/bulk.py --url postgresql://postgres:postgres@127.0.0.1:5432/axa_bench_console

Its failed jobs (1,000,000 of 10,000,000) are of names no worker here runs: retried, they stay
queued. First --queued no-op jobs are drained by one worker (``runworker --job
benchmarks.benchapp.jobs.noop``) alone; then the bulk retry of the Failed jobs list (no
filter) is confirmed through the admin at its defaults, a second worker runs its job
(``--job axa_django.bulk_operation``), and once it has done two batches the same drain runs
again beside it. Printed: both drains' jobs/s, the longest lock wait of the draining
worker's sessions (``pg_locks.waitstart``, sampled every 10 ms), and the bulk's total time,
rows/s and counts. At the end the retried jobs are put back to failed (--no-restore: not).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NOOP = "benchmarks.benchapp.jobs.noop"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True, help="the database benchmarks/console.py --keep left")
    parser.add_argument("--queued", type=int, default=200_000)
    parser.add_argument("--no-restore", action="store_true")
    parser.add_argument(
        "--drains-only",
        action="store_true",
        help="drain alone, twice beside the bulk, then cancel it and drain alone again; no wait for its end",
    )
    args = parser.parse_args()
    os.environ["DATABASE_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.history_settings"
    import django

    django.setup()
    import psycopg
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from axa_django.models.queue import BulkOperation

    db = psycopg.connect(args.url, autocommit=True)

    def q(statement: str, *params: Any) -> list[Any]:
        cursor = db.execute(statement, params)
        return cursor.fetchall() if cursor.description else []

    env = dict(os.environ, PYTHONPATH=str(ROOT), AXA_LOG_LEVEL="CRITICAL")
    procs: list[subprocess.Popen[bytes]] = []

    def worker(*extra: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "django", "runworker", *extra]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    def drain(label: str) -> None:
        q(
            "INSERT INTO axa_queue (id, name, args, queue) SELECT gen_random_uuid(), %s, '{}', 'default' "
            "FROM generate_series(1, %s)",
            NOOP,
            args.queued,
        )
        before = {row[0] for row in q("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'axa_django %%'")}
        proc = worker("--job", NOOP, "--concurrency", "4")
        left = "SELECT count(*) FROM ONLY axa_queue WHERE name = %s AND status IN ('queued', 'running')"
        while q(left, NOOP)[0][0] == args.queued:
            time.sleep(0.01)
        started = time.perf_counter()  # its first claim: the start-up left out
        time.sleep(0.2)  # its connections are open by now
        pids = [
            row[0]
            for row in q("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'axa_django %%'")
            if row[0] not in before
        ]
        waits = {"max": 0.0, "seen": 0}
        stop = threading.Event()

        def sample() -> None:
            with psycopg.connect(args.url, autocommit=True) as conn:
                while not stop.is_set():
                    longest, count = conn.execute(
                        "SELECT max(extract(epoch FROM clock_timestamp() - waitstart)), count(*) FROM pg_locks "
                        "WHERE NOT granted AND pid = ANY(%s)",
                        [pids],
                    ).fetchone()
                    if count:
                        waits["seen"] += 1
                        waits["max"] = max(waits["max"], float(longest or 0))
                    time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        start_left = args.queued
        while q(left, NOOP)[0][0]:
            time.sleep(0.05)
        took = time.perf_counter() - started
        stop.set()
        sampler.join()
        proc.terminate()
        proc.wait(timeout=60)
        print(
            f"drain {label}: {start_left:,} jobs in {took:.1f} s = {start_left / took:,.0f} jobs/s; longest lock wait "
            f"of the draining worker {waits['max'] * 1000:.0f} ms ({waits['seen']} samples waiting)",
            flush=True,
        )

    failed = q("SELECT count(*) FROM axa_queue WHERE status = 'failed'")[0][0]
    print(f"{failed:,} failed jobs; load average {os.getloadavg()[0]:.1f}", flush=True)
    try:
        drain("alone")
        user = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True})[0]
        client = Client()
        client.force_login(user)
        url = reverse("admin:axa_django_bulkoperation_start", args=["failedjob", "retry"])
        page = client.get(url)
        assert page.status_code == 200, page.status_code
        response = client.post(url, {"batch_size": "1000", "pause_ms": "500"})
        assert response.status_code == 302, response.status_code
        op = BulkOperation.objects.latest("id")
        confirmed = time.perf_counter()
        worker("--job", "axa_django.bulk_operation", "--concurrency", "1")
        while BulkOperation.objects.get(pk=op.pk).batches < 2:
            time.sleep(0.05)
        drain("beside the bulk retry")
        if args.drains_only:
            drain("beside the bulk retry, again")
            BulkOperation.objects.filter(pk=op.pk).update(cancel_requested=True)
            while BulkOperation.objects.get(pk=op.pk).status in ("queued", "running"):
                time.sleep(0.2)
            op = BulkOperation.objects.get(pk=op.pk)
            run = (op.finished_at - op.started_at).total_seconds()
            print(f"bulk retry {op.status} after {op.changed:,} rows in {run:.0f} s ({op.changed / run:,.0f} rows/s)")
            drain("alone again")
            return
        while BulkOperation.objects.get(pk=op.pk).status in ("queued", "running"):
            time.sleep(1)
        total = time.perf_counter() - confirmed
        op = BulkOperation.objects.get(pk=op.pk)
        run = (op.finished_at - op.started_at).total_seconds()
        print(
            f"bulk retry: {op.status}; {op.matched:,} matched, {op.changed:,} retried, skipped "
            f"{op.skipped_gone + op.skipped_key + op.skipped_refused + op.skipped_busy:,}; {op.batches:,} batches of "
            f"{op.batch_size:,}, pause {op.pause_ms} ms; {total:.0f} s from the confirmation, {run:.0f} s of run "
            f"({op.changed / max(run, 1e-9):,.0f} rows/s)",
            flush=True,
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        if not args.no_restore:
            back = "UPDATE axa_queue SET status = 'failed', finished_at = run_at WHERE status = 'queued' AND name <> %s"
            q(back, NOOP)
        db.close()


if __name__ == "__main__":
    main()
