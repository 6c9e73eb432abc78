"""What an idle fleet costs the database: N runworker processes with nothing to do (issue 46).

    DATABASE_URL=postgresql://... python benchmarks/idle.py [--workers 32] [--seconds 60]

Starts --workers ``runworker --concurrency 1`` processes on a fresh, empty
``axa_bench_idle`` database (benchmark settings: POLL_INTERVAL 1 s, notifications on),
waits until each has registered and 15 s more (its start's checks and first
housekeeping), then over --seconds measures the PostgreSQL server's CPU (all of it, and
the backends of the fleet's own connections apart: others' work on the same server
shows in the first only) and the
workers' (user + system, as a share of one core), the transactions committed or rolled
back in the database per second, and the connections the fleet holds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402
from benchmarks.run import base_url, connect, migrated_database, server_info  # noqa: E402

XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
CONNECTIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after all registered (default 15)")
    parser.add_argument("--db", default="axa_bench_idle")
    args = parser.parse_args()
    base = base_url()
    url = migrated_database(base, args.db)
    pg_pid = server_info(url)["pg_pid"]
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE="benchmarks.settings", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "django", "runworker", "--concurrency", "1"]
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(args.workers)
    ]
    try:
        with connect(url) as conn:
            measure.wait_until(
                lambda: conn.execute("SELECT count(*) FROM axa_worker").fetchone()[0] >= args.workers,
                120,
                "every worker to register",
                step=0.5,
            )
            time.sleep(args.settle)
            connections = conn.execute(CONNECTIONS).fetchone()[0]
            backends = [row[0] for row in conn.execute(BACKENDS)]
            xacts = conn.execute(XACTS).fetchone()[0]
            pg, workers, start = measure.tree_cpu([pg_pid]), measure.tree_cpu([p.pid for p in procs]), time.monotonic()
            own = measure.tree_cpu(backends)
            time.sleep(args.seconds)
            pg, workers = measure.tree_cpu([pg_pid]) - pg, measure.tree_cpu([p.pid for p in procs]) - workers
            own = measure.tree_cpu(backends) - own
            elapsed = time.monotonic() - start
            xacts = conn.execute(XACTS).fetchone()[0] - xacts
        print(
            f"{args.workers} idle workers, {elapsed:.0f} s: PostgreSQL CPU {100 * pg / elapsed:.2f}% of a core "
            f"(the fleet's own backends {100 * own / elapsed:.2f}%), "
            f"workers' CPU {100 * workers / elapsed:.2f}% of a core, {xacts / elapsed:.1f} transactions/s, "
            f"{connections} connections ({connections / args.workers:.1f} a worker)"
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        with connect(base) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
