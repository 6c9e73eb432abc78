"""The on-call console at scale: each admin page's first load and refresh, each search form, with a huge history.

    python benchmarks/console.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres --rows 10000000

Creates (and at the end drops) the database ``axa_bench_console`` (``--db``) and fills it as
issue 47 describes: ``--rows`` finished jobs in the history over 30 days (90% completed,
10% failed with an error; 50 job names; arguments ``{"user_id": ..., "order": {"id": ...}}``),
``--queued`` ready jobs in 5 queues, and 8 live workers (rows of ``axa_worker`` with a fresh
heartbeat, each running 4 jobs). Each page is loaded once (its first load: the Job names page
after its kept figures are emptied, the dashboard after its kept hours are) and then
``--reps`` times (the median is its refresh), through Django's test client logged in as a
superuser. The searches run without the opt-in arguments index, then with it (built here
as the documented migration builds it). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.dashboard import drop_database, with_database

NAME = "axa_bench_console"
DAYS = 30
NAMES = 50

FILL = """
INSERT INTO axa_history
    (id, name, args, queue, status, error, run_at, created_at, updated_at, started_at, finished_at, attempts)
SELECT gen_random_uuid(), 'bench.console' || (i %% {names}),
       jsonb_build_object('user_id', i %% 100000, 'order', jsonb_build_object('id', i)),
       'q' || (i %% 5), s.status,
       CASE WHEN s.status = 'failed' THEN 'ValueError: order ' || i || ' was refused' END,
       s.at, s.at, s.at + interval '50 ms', s.at + interval '20 ms',
       s.at + (20 + (i %% 7) * 30) * interval '1 ms', 1
FROM generate_series(1, %(rows)s) AS i
CROSS JOIN LATERAL (SELECT
    CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END AS status,
    now() - interval '1 minute' - (i::float8 / %(rows)s) * interval '{days} days' AS at) AS s
""".replace("{names}", str(NAMES)).replace("{days}", str(DAYS))

QUEUED = """
INSERT INTO axa_queue (id, name, args, queue)
SELECT gen_random_uuid(), 'bench.console' || (i %% {names}), jsonb_build_object('user_id', i), 'q' || (i %% 5)
FROM generate_series(1, %(queued)s) AS i
""".replace("{names}", str(NAMES))

WORKERS = """
INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, lease_seconds)
SELECT gen_random_uuid(), 'host-' || w, 1000 + w, 4, '[]', '[]', '[]', 30
FROM generate_series(1, 8) AS w
"""
RUNNING = """
UPDATE axa_queue SET status = 'running', started_at = now(), attempts = 1,
    worker_id = (SELECT id FROM axa_worker ORDER BY id OFFSET (n.r %% 8) LIMIT 1)
FROM (SELECT id AS job, row_number() OVER () AS r FROM axa_queue WHERE status = 'queued' LIMIT 32) n
WHERE axa_queue.id = n.job
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--db", default=NAME, help="the database made (and dropped) for the run")
    parser.add_argument("--keep", action="store_true", help="leave the database for another run")
    parser.add_argument("--reuse", action="store_true", help="use the database a --keep run left, as it is")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import psycopg

    if not args.reuse:
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

    from axa_django.ops import searchindex

    def sql(statement: str, params: Any = None) -> list[Any]:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    if not args.reuse:
        call_command("migrate", verbosity=0)
        get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        started = time.perf_counter()
        sql(FILL, {"rows": args.rows})
        sql(QUEUED, {"queued": args.queued})
        sql(WORKERS)
        sql(RUNNING, {})
        filled = time.perf_counter() - started
        started = time.perf_counter()
        sql("VACUUM ANALYZE")
        sql("CHECKPOINT")
        vacuumed = time.perf_counter() - started
        print(f"filled {args.rows:,} finished jobs in {filled:.0f} s, vacuumed in {vacuumed:.0f} s")
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench"))
    (version,) = sql("SELECT version()")[0]
    counts = sql(
        "SELECT (SELECT count(*) FROM ONLY axa_queue), (SELECT reltuples::bigint FROM pg_class "
        "WHERE relname = 'axa_history'), pg_size_pretty(pg_total_relation_size('axa_history'))"
    )[0]
    print(f"server: {version.split(',')[0]}; axa_queue {counts[0]:,} rows, history about {counts[1]:,} ({counts[2]})")
    failed_id = sql("SELECT id FROM axa_history WHERE status = 'failed' ORDER BY finished_at DESC LIMIT 1")[0][0]

    def get(url: str) -> float:
        sql("UPDATE axa_worker SET heartbeat_at = now()")  # the 8 workers stay live
        started = time.perf_counter()
        response = client.get(url)
        took = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, (url, response.status_code)
        return took

    def page(label: str, url: str, before: str | None = None) -> None:
        if before:
            sql(before)
        first = get(url)
        times = [get(url) for _ in range(args.reps)]
        print(f"{label:<58} {first:>9.1f} {statistics.median(times):>9.1f} {max(times):>9.1f}", flush=True)

    jobs = reverse("admin:axa_django_job_changelist")
    failed = reverse("admin:axa_django_failedjob_changelist")
    print(f"{'page (ms)':<58} {'first':>9} {'median':>9} {'max':>9}   ({args.reps} loads after the first)")
    page("dashboard", reverse("admin:axa_django_queuedashboard_changelist"), "TRUNCATE axa_finished_hour")
    page("dashboard, its poll (JSON)", reverse("admin:axa_django_queuedashboard_data"))
    page("job names", reverse("admin:axa_django_jobnames_changelist"), "TRUNCATE axa_name_stat, axa_name_span")
    page("job names, one name's page", reverse("admin:axa_django_jobnames_name") + "?name=bench.console7")
    page("queues", reverse("admin:axa_django_queue_changelist"))
    page("queues, its poll (JSON)", reverse("admin:axa_django_queue_data"))
    page("workers", reverse("admin:axa_django_liveworker_changelist"))
    page("workers, its poll (JSON)", reverse("admin:axa_django_liveworker_data"))
    page("periodic jobs", reverse("admin:axa_django_periodicjob_changelist"))
    page("a failed job's page (timeline)", reverse("admin:axa_django_job_change", args=[failed_id]))
    page("jobs list", jobs)
    page("failed jobs list", failed)
    searches = [
        ("name:bench.console7", jobs),
        ("queue:q3", jobs),
        ("status:failed", jobs),
        ("after:" + sql("SELECT to_char(now() - interval '1 day', 'YYYY-MM-DD')")[0][0], jobs),
        ("name:bench.console7 after:" + sql("SELECT to_char(now() - interval '1 day', 'YYYY-MM-DD')")[0][0], failed),
        ("args.user_id:4242", jobs),
        ("args.order.id:777770", jobs),
        ("args.user_id:4242 status:failed", jobs),
    ]
    from urllib.parse import urlencode

    for with_index in (False, True):
        if with_index:
            started = time.perf_counter()
            with connection.schema_editor() as editor:
                built = searchindex.create(editor, searchindex.ARGS)
            print(f"built the opt-in arguments index ({', '.join(built)}) in {time.perf_counter() - started:.0f} s")
            sql("ANALYZE")
        for term, url in searches:
            if with_index and not term.startswith("args"):
                continue
            where = "failed list" if url == failed else "jobs list"
            label = f"search {term!r} ({where}{', args index' if with_index else ''})"
            page(label, url + "?" + urlencode({"q": term}))
    connection.close()
    if not args.keep:
        drop_database(args.url, args.db)


if __name__ == "__main__":
    main()
