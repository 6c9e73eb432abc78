"""What one claim costs as the ready rows spread over job names (issue: the cost as the work grows).

    DATABASE_URL=postgresql://... python benchmarks/claim_spread.py [--shapes 1x100000,100x1000,1000x100] [--limit 64]

For each shape NAMESxROWS it fills a fresh ``axa_bench_spread`` database with that many
ready rows (one INSERT, so they share one run_at, as a bulk enqueue's do), then runs
EXPLAIN (ANALYZE, BUFFERS) of the worker's lane claim (``sql.CLAIM_LANES``, priority 0 a
lane with its floor at -infinity, as a worker's first claim) for --limit rows, in a
transaction rolled back. It prints the rows the claim locked (its LockRows nodes), the
buffers it touched and its execution time: how the claim's work grows (or does not) as
the same rows spread over more names.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.run import base_url, connect, migrated_database, server_info  # noqa: E402


def locked(node: dict[str, Any]) -> int:
    """Rows the LockRows nodes under ``node`` returned, over all their loops."""
    own = node.get("Actual Rows", 0) * node.get("Actual Loops", 1) if node.get("Node Type") == "LockRows" else 0
    return own + sum(locked(child) for child in node.get("Plans", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="1x100000,100x1000,1000x100", help="NAMESxROWS, comma separated")
    parser.add_argument("--limit", type=int, default=64, help="rows the claim asks for (default 64)")
    parser.add_argument("--db", default="axa_bench_spread")
    args = parser.parse_args()
    base = base_url()
    url = migrated_database(base, args.db)
    import django

    django.setup()
    from axa_django import sql

    info = server_info(url)
    print(f"server: PostgreSQL {info['version']}, {info['connection']}; claims of {args.limit}")
    for shape in args.shapes.split(","):
        count, rows = (int(part) for part in shape.split("x"))
        names = [f"bench.spread{i}" for i in range(count)]
        statement = sql.compose(sql.CLAIM_LANES, names, [], None, lanes=[0])
        floors = [None if lane is None else "-infinity" for lane, _, _ in sql.segments([0])]
        params = {"worker": uuid.uuid4(), "limit": args.limit, "ahead": True, "floors": floors}
        with connect(url) as conn:
            conn.execute("TRUNCATE axa_queue CASCADE")
            conn.execute(
                "INSERT INTO axa_queue (id, name, args) "
                "SELECT gen_random_uuid(), 'bench.spread' || (g %% %s), '{}' FROM generate_series(0, %s - 1) g",
                [count, count * rows],
            )
            conn.execute("VACUUM ANALYZE axa_queue")
            with conn.transaction(force_rollback=True):
                plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchone()[0][0]
        top = plan["Plan"]
        print(
            f"{count:>5} names x {rows:>6} rows: locked {locked(top):>7} rows for {args.limit}, "
            f"buffers {top.get('Shared Hit Blocks', 0) + top.get('Shared Read Blocks', 0):>7}, "
            f"{plan['Execution Time']:8.1f} ms"
        )
    with connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
