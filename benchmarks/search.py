"""The admin's job search on a big history, each form, without and with the opt-in indexes: ms, printed.

    python benchmarks/search.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres --rows 10000000

Creates the database ``axa_bench_search`` (``--db``; kept with ``--keep``, reused with
``--reuse``), fills the history with ``--rows`` finished jobs over 30 days (5% failed, a
timeout error in one failure of 40) whose arguments are ``{"user_id": i % 100000,
"order": {"id": i}, ...}``, and ``--ready`` queued jobs in 5 queues; vacuums and analyzes it
as autovacuum would. Then loads the Jobs (and Failed jobs) list with each search form:
``--reps`` times for a form an index answers, ``--slow-reps`` for one that reads every job
(stopped at the search's bound), without the opt-in indexes, then again with them
(axa_django.ops.searchindex, built CONCURRENTLY). Each line gives the median and the
largest time, how many jobs the page counted against SQL's own count, and the indexes the
list's statement walked (its EXPLAIN ANALYZE). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.dashboard import drop_database, timed, with_database

NAME = "axa_bench_search"
DAYS = 30

FILL = """
INSERT INTO axa_history
    (id, name, args, queue, status, run_at, created_at, updated_at, started_at, finished_at, attempts, error)
SELECT gen_random_uuid(), 'app.jobs.job' || (i %% 10),
       jsonb_build_object('user_id', i %% 100000, 'order', jsonb_build_object('id', i),
                          'email', 'user' || (i %% 100000) || '@example.com'),
       'q' || (i %% 5), s.status, s.at, s.at, s.at + interval '50 ms', s.at + interval '20 ms',
       s.at + interval '50 ms', 1,
       CASE WHEN s.status = 'failed' THEN CASE WHEN i %% 40 = 0 THEN 'TimeoutError: upstream timed out after 30 s'
                                              ELSE 'ValueError: bad value ' || i END END
FROM generate_series(1, %(rows)s) AS i
CROSS JOIN LATERAL (SELECT CASE WHEN i %% 20 = 0 THEN 'failed' ELSE 'completed' END AS status,
    now() - interval '1 hour' - (i::float8 / %(rows)s) * interval '{days} days' AS at) AS s
""".replace("{days}", str(DAYS))
READY = """
INSERT INTO axa_queue (id, name, args, queue, created_at, run_at)
SELECT gen_random_uuid(), 'app.jobs.job' || (i %% 10),
       jsonb_build_object('user_id', i %% 100000, 'order', jsonb_build_object('id', -i)), 'q' || (i %% 5),
       now() - i * interval '10 ms', now()
FROM generate_series(1, %(ready)s) AS i
"""

# (label, list, the search, SQL of our own counting its matches)
FORMS = [
    ("args.user_id (one of 100,000)", "jobs", "args.user_id:4242", """args @> '{"user_id": 4242}'"""),
    ("args.order.id (one job)", "jobs", "args.order.id:777777", """args @> '{"order": {"id": 777777}}'"""),
    (
        "args + status + queue",
        "jobs",
        "status:failed queue:q0 args.user_id:4240",
        """status = 'failed' AND queue = 'q0' AND args @> '{"user_id": 4240}'""",
    ),
    ("args on Failed jobs", "failed", "args.user_id:4240", """status = 'failed' AND args @> '{"user_id": 4240}'"""),
    ("name", "jobs", "name:app.jobs.job3", "name = 'app.jobs.job3'"),
    ("queue", "jobs", "queue:q2", "queue = 'q2'"),
    ("status", "jobs", "status:failed", "status = 'failed'"),
    ("name + status", "jobs", "name:app.jobs.job0 status:failed", "name = 'app.jobs.job0' AND status = 'failed'"),
    ("a day (after: before:)", "jobs", "after:{day} before:{next}", "created_at >= {day} AND created_at < {next}"),
    (
        "a day on Failed jobs",
        "failed",
        "after:{day} before:{next}",
        "status = 'failed' AND finished_at >= {day} AND finished_at < {next}",
    ),
    ("error text (common)", "jobs", "error:timed", "error ILIKE '%%timed%%'"),
    ("error text (one job)", "jobs", 'error:"bad value 777780"', "error ILIKE '%%bad value 777780%%'"),
    (
        "a word (one job)",
        "jobs",
        "user77777@",
        "name ILIKE '%%user77777@%%' OR args::text ILIKE '%%user77777@%%' OR error ILIKE '%%user77777@%%'",
    ),
    ("a name no job has", "jobs", "name:app.jobs.none", "name = 'app.jobs.none'"),
]
SLOW = ("error", "a word", "a name no job has")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--ready", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--slow-reps", type=int, default=3, help="loads of a search that reads every job")
    parser.add_argument("--db", default=NAME, help="the database made (and dropped) for the run")
    parser.add_argument("--keep", action="store_true", help="leave the database for another run")
    parser.add_argument("--reuse", action="store_true", help="use the database a --keep run left (no fill)")
    return parser.parse_args(argv)


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
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment
    from django.urls import reverse

    from axa_django.ops import searchindex

    setup_test_environment()  # responses keep their context: the page's own count

    def sql(statement: str, params: Any = None) -> list[Any]:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    if not args.reuse:
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        sql(FILL, {"rows": args.rows})
        sql(READY, {"ready": args.ready})
        for table in ("axa_queue", "axa_history"):
            sql(f"VACUUM ANALYZE {table}")
        sql("CHECKPOINT")
        print(f"filled {args.rows:,} finished and {args.ready:,} queued jobs in {time.perf_counter() - started:.0f} s")
    [(version, rows)] = sql("SELECT version(), (SELECT count(*) FROM axa_history)")
    print(f"server: {version.split(',')[0]}; {rows:,} jobs in axa_history; load average {os.getloadavg()[0]:.1f}")
    user = get_user_model().objects.filter(username="bench").first() or get_user_model().objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)
    urls = {
        "jobs": reverse("admin:axa_django_job_changelist"),
        "failed": reverse("admin:axa_django_failedjob_changelist"),
    }
    [(day, following)] = sql(
        "SELECT to_char(d, 'YYYY-MM-DD'), to_char(d + interval '1 day', 'YYYY-MM-DD') "
        "FROM (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') - interval '15 days' AS d) AS t"
    )

    def load(url: str, term: str) -> Any:
        response = client.get(url, {"q": term})
        assert response.status_code == 200, (term, response.status_code)
        return response

    def indexes_walked(url: str, term: str) -> str:
        with CaptureQueriesContext(connection) as queries:
            load(url, term)
        # The rows' statement: ordered, not the count (a page of fewer than 50 has no LIMIT).
        listing = [
            q["sql"]
            for q in queries.captured_queries
            if '"axa_queue"' in q["sql"] and "ORDER BY" in q["sql"] and "COUNT(" not in q["sql"]
        ]
        if not listing:
            return "(no statement: the search was stopped)"
        plan = "\n".join(row[0] for row in sql("EXPLAIN (ANALYZE, BUFFERS) " + listing[-1]))
        walked = sorted(set(re.findall(r"Index (?:Only )?Scan (?:Backward )?(?:using|on) (\S+)", plan)))
        ran = re.search(r"Execution Time: ([\d.]+) ms", plan)
        shown = ", ".join(walked) + (" + Seq Scan" if "Seq Scan" in plan else "")
        return f"{shown} ({float(ran.group(1)) if ran else 0:.1f} ms)"

    def measure() -> dict[str, tuple[float, float, str, str]]:
        figures = {}
        for label, page, template, where in FORMS:
            term = template.replace("{day}", day).replace("{next}", following)
            # A date typed in the search box is in the site's time zone (settings.TIME_ZONE).
            zone = settings.TIME_ZONE
            where = where.replace("{day}", f"'{day}'::timestamp AT TIME ZONE '{zone}'")
            where = where.replace("{next}", f"'{following}'::timestamp AT TIME ZONE '{zone}'")
            own = sql("SELECT count(*) FROM axa_queue WHERE " + where)[0][0]
            reps = args.slow_reps if label.startswith(SLOW) else args.reps
            median, _, most = timed(lambda page=page, term=term: load(urls[page], term), reps)
            cl = load(urls[page], term).context["cl"]
            shown = "stopped" if cl.search_stopped else f"{'~' if cl.estimated else ''}{cl.result_count:,}"
            figures[label] = (median, most, f"{shown}/{own:,}", indexes_walked(urls[page], term))
        return figures

    with connection.schema_editor(atomic=False) as editor:  # a --reuse of a run that built them
        searchindex.drop(editor, searchindex.ARGS, *searchindex.TRIGRAMS)
    without = measure()
    started = time.perf_counter()
    with connection.schema_editor(atomic=False) as editor:
        sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        searchindex.create(editor, searchindex.ARGS)
        took_args = time.perf_counter() - started
        searchindex.create(editor, *searchindex.TRIGRAMS)
    took = time.perf_counter() - started
    for table in ("axa_queue", "axa_history"):
        sql(f"ANALYZE {table}")
    print(f"opt-in indexes built CONCURRENTLY: args in {took_args:.0f} s, args and trigrams in {took:.0f} s")
    for name, size in sql(
        "SELECT relname, pg_size_pretty(pg_relation_size(oid)) FROM pg_class "
        "WHERE relname ~ '_(args_path|name_trgm|args_trgm|error_trgm)$' ORDER BY 1"
    ):
        print(f"  {name}: {size}")
    opted = measure()
    print(f"{'ms (median, max)':<32} {'no opt-in index':>18} {'opt-in indexes':>18}  page/SQL count; indexes walked")
    for label, (median, most, counted, walked) in without.items():
        after = opted[label]
        print(
            f"{label:<32} {median:>9.1f} {most:>8.1f} {after[0]:>9.1f} {after[1]:>8.1f}  {counted} {after[2]}; {walked}"
        )
        print(f"{'':<32} {'':>37}  with: {after[3]}")
    if not args.keep:
        connection.close()
        drop_database(args.url, args.db)


if __name__ == "__main__":
    main()
