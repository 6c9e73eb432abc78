"""Where the database's time per job goes: a drain read through ``pg_stat_statements``.

Enqueues ``--jobs`` no-op jobs in bulk, resets ``pg_stat_statements``, drains them with
one ``runworker --burst`` at its defaults, and prints, per statement and in total per
job: execution time, WAL records and shared buffers hit. ``--drop-index`` drops an
index of ``axa_queue`` first (repeatable): what each index costs the hot path.

The server must load the extension (``shared_preload_libraries = 'pg_stat_statements'``).

``python benchmarks/statements.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from benchmarks.run import fresh_database  # noqa: E402

DATABASE = "axa_statements"
PER_STATEMENT = """
SELECT calls, total_exec_time, wal_records, shared_blks_hit, regexp_replace(query, '\\s+', ' ', 'g')
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
AND query LIKE '%%axa_queue%%' ORDER BY total_exec_time DESC
"""
FILL = """
import django
django.setup()
from benchmarks.benchapp.jobs import noop
for _ in range({parts}):
    noop.perform_later_many([{{}}] * 5000)
"""


def django_env(url: str) -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="benchmarks.settings")


def drain(url: str, jobs: int) -> list[tuple[int, float, int, int, str]]:
    env = django_env(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE axa_queue")
        conn.execute("VACUUM ANALYZE axa_queue")
    subprocess.run([sys.executable, "-c", FILL.format(parts=max(jobs // 5000, 1))], cwd=ROOT, env=env, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        conn.execute("SELECT pg_stat_statements_reset()")
    subprocess.run(
        [sys.executable, "-m", "django", "runworker", "--burst"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(row) for row in conn.execute(PER_STATEMENT)]  # type: ignore[misc]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per round, a multiple of 5,000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drop-index", action="append", default=[], metavar="NAME")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    url = fresh_database(args.url, DATABASE)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=django_env(url), check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for name in args.drop_index:
            conn.execute(psycopg.sql.SQL("DROP INDEX {}").format(psycopg.sql.Identifier(name)))
    jobs = max(args.jobs // 5000, 1) * 5000
    totals = []
    for round_ in range(args.rounds):
        rows = drain(url, jobs)
        per_job = [sum(row[i] for row in rows) / jobs for i in (1, 2, 3)]
        totals.append(per_job)
        us, wal, hit = per_job[0] * 1000, per_job[1], per_job[2]
        print(f"round {round_ + 1}: {us:.1f} us, {wal:.1f} WAL records, {hit:.1f} buffers per job")
        if round_ == args.rounds - 1:
            for calls, ms, wal, hit, query in rows[:4]:
                print(
                    f"  {calls:6d} calls {ms * 1000 / jobs:6.1f} us/job {wal / jobs:5.1f} WAL/job "
                    f"{hit / jobs:5.1f} buffers/job  {query[:70]}"
                )
    median = [statistics.median(t[i] for t in totals) for i in range(3)]
    dropped = ", ".join(args.drop_index) or "none"
    print(
        f"median of {args.rounds}: {median[0] * 1000:.1f} us, {median[1]:.1f} WAL records, "
        f"{median[2]:.1f} buffers per job (indexes dropped: {dropped})"
    )
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    main()
