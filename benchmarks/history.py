"""The hot paths with a huge history: enqueue, claim, the admin's lists, the dashboard and pruning, small vs --rows.

    python benchmarks/history.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres --rows 10000000

Creates (and at the end drops) the database ``axa_bench_history`` (``--db``) on that server and
times each read or write ``--reps`` times on a small history (``--base-rows`` finished
jobs: enough that every admin page shows a full page), then again after ``--rows`` of
them (95% completed, 5% failed, spread over 30 days), the table vacuumed and analyzed
each time as autovacuum would. A backlog of ``--ready`` ready
jobs stands in both runs. The finished rows go where finished jobs live (``axa_history``).
Last, retention: the history table is closed and dropped whole, as RETENTION does
(axa_django/history.py), and its time printed. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.dashboard import drop_database, with_database
from benchmarks.dashboard import timed as spread

NAME = "axa_bench_history"
DAYS = 30

FILL = """
INSERT INTO axa_history
    (id, name, args, queue, status, run_at, created_at, updated_at, started_at, finished_at, attempts)
SELECT gen_random_uuid(), 'benchmarks.benchapp.jobs.noop', '{}', 'default', s.status, s.at, s.at,
       s.at + interval '50 ms', s.at + interval '20 ms', s.at + interval '50 ms', 1
FROM generate_series(1, %(rows)s) AS i
CROSS JOIN LATERAL (SELECT
    CASE WHEN i %% 20 = 0 THEN 'failed' ELSE 'completed' END AS status,
    now() - interval '1 hour' - (i::float8 / %(rows)s) * interval '{days} days' AS at) AS s
""".replace("{days}", str(DAYS))


def timed(function: Callable[[], Any], reps: int) -> float:
    """Median milliseconds of ``function()``, after one warm-up call."""
    return spread(function, reps)[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--base-rows", type=int, default=2000)
    parser.add_argument("--ready", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--db", default=NAME, help="the database made (and dropped) for the run")
    parser.add_argument("--keep", action="store_true", help="leave the database for another run")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()

    import psycopg

    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.db}"')
    os.environ["DATABASE_URL"] = with_database(args.url, args.db)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.history_settings"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from axa_django import history, sql
    from axa_django.ops import dashboard
    from axa_django.worker import connect
    from benchmarks.benchapp import jobs

    call_command("migrate", verbosity=0)
    admin = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(admin)
    lists = {
        "admin: job list": reverse("admin:axa_django_job_changelist"),
        "admin: job list, failed": reverse("admin:axa_django_job_changelist") + "?status__exact=failed",
        "admin: failed jobs": reverse("admin:axa_django_failedjob_changelist"),
        "admin: dashboard page": reverse("admin:axa_django_queuedashboard_changelist"),
    }
    worker = connect("default", "bench claimer")
    claim = sql.compose(sql.CLAIM_FULL, [jobs.noop.name], [], None)

    def get(url: str) -> None:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)

    def claim_and_give_back() -> None:
        with worker.transaction(force_rollback=True):
            rows = worker.execute(claim, {"worker": uuid.uuid4(), "limit": 16, "ahead": False}).fetchall()
            assert len(rows) == 17, len(rows)  # 16 jobs and the snapshot row

    def measure() -> dict[str, float]:
        jobs.noop.perform_later_many([{} for _ in range(args.ready)])
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE axa_finished_hour")  # the first load counts the day's past hours, once
        started = time.perf_counter()
        get(lists["admin: dashboard page"])
        figures = {
            "admin: dashboard page, first load": (time.perf_counter() - started) * 1000,
            "enqueue one (perform_later)": timed(jobs.noop.perform_later, args.reps),
            "enqueue 100 (perform_later_many)": timed(lambda: jobs.noop.perform_later_many([{}] * 100), args.reps),
            "claim 16 (the worker's statement)": timed(claim_and_give_back, args.reps),
            "dashboard refresh (JSON poll)": timed(dashboard.live_response, args.reps),
        }
        for label, url in lists.items():
            figures[label] = timed(lambda url=url: get(url), args.reps)
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM axa_queue WHERE status = 'queued' AND name = %s AND run_at > now() - interval '1 hour'",
                [jobs.noop.name],
            )
        return figures

    def settle() -> None:
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE axa_queue")
            cursor.execute("VACUUM ANALYZE axa_history")
            # Else the load's dirty pages are written while we time: each commit's flush waits.
            cursor.execute("CHECKPOINT")
        worker.execute("DISCARD PLANS")

    with connection.cursor() as cursor:
        cursor.execute(FILL, {"rows": args.base_rows})
    settle()
    small = measure()
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE axa_queue CASCADE")
        cursor.execute(FILL, {"rows": args.rows})
    filled = time.perf_counter() - started
    started = time.perf_counter()
    settle()
    print(f"filled {args.rows:,} finished rows in {filled:.0f} s, vacuumed in {time.perf_counter() - started:.0f} s")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version(), pg_size_pretty(pg_total_relation_size('axa_queue')), "
            "pg_size_pretty(pg_total_relation_size('axa_history'))"
        )
        version, size, kept = cursor.fetchone()
    print(f"server: {version.split(',')[0]}; with their indexes: axa_queue {size}, axa_history {kept}")
    full = measure()
    print(f"{'median ms':<40} {args.base_rows:>9,} {args.rows:>12,} {'ratio':>7}")
    for label, before in small.items():
        print(f"{label:<40} {before:>9.2f} {full[label]:>12.2f} {full[label] / before:>6.2f}x")
    with connection.cursor() as cursor:
        history.prepare(cursor)
        started = time.perf_counter()
        closed = history.close(cursor, datetime.timedelta(0))
        took_close = time.perf_counter() - started
        started = time.perf_counter()
        dropped = history.drop(cursor, datetime.timedelta(0))
        took = time.perf_counter() - started
        cursor.execute("SELECT count(*) FROM axa_queue WHERE status IN ('completed', 'failed')")
        left = cursor.fetchone()[0]
    assert closed is not None and dropped == closed, (closed, dropped)
    print(
        f"retention: the history table closed in {took_close * 1000:.1f} ms, and its {args.rows:,} rows dropped "
        f"whole in {took * 1000:.1f} ms ({left:,} finished rows left)"
    )
    worker.close()
    connection.close()
    if not args.keep:
        drop_database(args.url, args.db)


if __name__ == "__main__":
    main()
