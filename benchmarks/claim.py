"""axa's claim on an empty table versus one with a large history (axa only: the peers' claims differ)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.common import sql


def time_claim(reps: int = 300) -> tuple[float, str]:
    """Median milliseconds of the worker's CLAIM for one job, rolled back each time, and its plan."""
    import psycopg

    from axa_django import sql as statements
    from axa_django.worker import connect

    timings = []
    with connect("default", "bench") as conn:
        conn.autocommit = False
        # As the worker composes it: names, backends and queues written in once.
        query = statements.compose(statements.CLAIM, ["benchmarks.benchapp.jobs.noop"], [], None)
        params = {"worker": None, "limit": 4, "ahead": False}
        for _ in range(reps):
            start = time.perf_counter()
            rows = conn.execute(query, params).fetchall()
            timings.append((time.perf_counter() - start) * 1000)
            assert len(rows) == 1, rows
            conn.rollback()
        plan = "\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + psycopg.sql.SQL(query), params))
        conn.rollback()
    return statistics.median(timings), plan


def bench_claim(url: str, finished_rows: int, foreign_rows: int) -> dict[str, Any]:
    """Claim timings on axa's benchmark database ``url``."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from benchmarks.benchapp.jobs import noop

    sql("TRUNCATE axa_queue, axa_worker")
    noop.perform_later()
    sql("VACUUM ANALYZE axa_queue")
    results: dict[str, Any] = {}
    results["claim_empty_ms"], _ = time_claim()
    sql(
        "INSERT INTO axa_queue (id, name, args, status, run_at, finished_at) "
        "SELECT gen_random_uuid(), 'benchmarks.benchapp.jobs.noop', '{}', "
        "CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'completed' END, now() - interval '1 day', now() "
        "FROM generate_series(1, %s) AS i",
        [finished_rows],
    )
    sql(
        "INSERT INTO axa_queue (id, name, args, run_at) "
        "SELECT gen_random_uuid(), 'other.service.job', '{}', now() - interval '1 hour' "
        "FROM generate_series(1, %s)",
        [foreign_rows],
    )
    sql("VACUUM ANALYZE axa_queue")
    results["claim_big_ms"], results["claim_big_plan"] = time_claim()
    sql("TRUNCATE axa_queue, axa_worker")
    return results
