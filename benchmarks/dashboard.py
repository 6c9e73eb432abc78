"""The live dashboard's refresh (its JSON poll) and jobhealth on a large axa_queue: milliseconds, printed.

    python benchmarks/dashboard.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres --rows 1000000

Creates (and at the end drops) the database ``axa_bench_dashboard`` on that server, fills
it with ``--rows`` rows shaped like a busy day (mostly finished over 24 hours, some
failed, a backlog of ready and scheduled jobs in a few queues, jobs running under live
workers), vacuums and analyzes it as autovacuum would, then times each read ``--reps``
times. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NAME = "axa_bench_dashboard"

FILL = """
INSERT INTO axa_queue (id, name, args, queue, status, run_at, started_at, finished_at, attempts)
SELECT gen_random_uuid(), 'bench.job.' || (i %% 20), '{}', (ARRAY['default', 'mail', 'reports', 'media'])[1 + i %% 4],
       s.status, s.run_at, CASE WHEN s.status IN ('completed', 'failed') THEN s.run_at + interval '20 ms' END,
       CASE WHEN s.status IN ('completed', 'failed') THEN s.run_at + interval '50 ms' END,
       CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END
FROM generate_series(1, %(rows)s) AS i
CROSS JOIN LATERAL (SELECT
    CASE WHEN i %% 100 < 90 THEN 'completed' WHEN i %% 100 < 95 THEN 'failed' ELSE 'queued' END AS status,
    CASE WHEN i %% 100 >= 98 THEN now() + (i %% 3600) * interval '1 second'
         ELSE now() - (i::float8 / %(rows)s) * interval '24 hours' END AS run_at) AS s
"""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def drop_database(url: str, name: str) -> None:
    """Drop database ``name`` on the server at ``url``, its sessions too."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def timed(function, reps: int) -> tuple[float, float, float]:
    """(median, p95, max) milliseconds of ``function()``, after one warm-up call."""
    function()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        function()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.95))], times[-1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (the docs' sample is parsed by this)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="leave the database for another run")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()

    import psycopg

    with psycopg.connect(args.url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [NAME]).fetchone()
        if not (exists and args.keep):
            conn.execute(f'DROP DATABASE IF EXISTS "{NAME}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{NAME}"')
            exists = None
    os.environ["DATABASE_URL"] = with_database(args.url, NAME)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from axa_django import unhandled
    from axa_django.ops import dashboard, fleetstats, health

    def sql(statement: str, params: object = None) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)

    if not exists:
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        sql(FILL, {"rows": args.rows})
        # Live workers, each running two jobs.
        for host in ("host-a", "host-b", "host-c"):
            sql(
                "WITH w AS (INSERT INTO axa_worker (id, hostname, pid, concurrency, queues) "
                "VALUES (gen_random_uuid(), %s, 1, 8, '[]') RETURNING id) "
                "INSERT INTO axa_queue (id, name, args, status, run_at, started_at, worker_id, attempts) "
                "SELECT gen_random_uuid(), 'bench.job.1', '{}', 'running', now(), now(), w.id, 1 "
                "FROM w, generate_series(1, 2)",
                [host],
            )
        print(f"filled {args.rows:,} rows in {time.perf_counter() - started:.1f}s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE axa_queue")
        cursor.execute("UPDATE axa_worker SET heartbeat_at = now()")
        cursor.execute("SELECT status, count(*) FROM axa_queue GROUP BY 1 ORDER BY 1")
        print("rows by status:", ", ".join(f"{s} {n:,}" for s, n in cursor.fetchall()))
        cursor.execute("SELECT version()")
        print("server:", cursor.fetchone()[0].split(",")[0])
    lines = [
        ("live refresh (JSON poll: fleetstats.collect + JSON)", dashboard.live_response),
        ("  fleetstats.collect alone", lambda: fleetstats.collect()),
        ("jobhealth (figures + unhandled names)", lambda: health.check()),
        ("full page's own figures (totals by status, 24 h chart)", lambda: (dashboard.collect(), unhandled.find())),
    ]
    for label, function in lines:
        median, p95, worst = timed(function, args.reps)
        print(f"{label}: median {median:.1f} ms, p95 {p95:.1f} ms, max {worst:.1f} ms ({args.reps} reps)", flush=True)
    connection.close()
    if not args.keep:
        drop_database(args.url, NAME)


if __name__ == "__main__":
    main()
