"""How fast one worker drains the same no-op jobs spread over job names, priorities or queues (issue 46).

    DATABASE_URL=postgresql://... python benchmarks/spread.py [--jobs 100000] [--rounds 2]
        [--shapes names:1x100000,names:100x1000,names:1000x100,priorities:20,queues:50]
        [--worker-args "--burst --concurrency 1"]

Each shape fills a fresh ``axa_bench_spread`` database with --jobs ready no-op rows (one
INSERT, as a bulk enqueue writes them) and times ``runworker`` (with --worker-args) from
the first job's start to the last one's end (their rows' times; --burst: it stops once
none is left), every worker process serving
the same 1,000 registered names (BENCH_SPREAD_NAMES) whatever the shape, and samples the
PostgreSQL server's CPU (its processes' user + system time) over the drain. Rounds run the
shapes interleaved; each line is one drain:

- ``names:NxR``: N names of R jobs each, priority 0, the default queue;
- ``priorities:P``: one name, its jobs spread evenly over priorities 0..P-1;
- ``queues:Q``: one name, spread over Q queues; an all-queues worker.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.measure import Sample  # noqa: E402
from benchmarks.run import connect, migrated_database, server_info  # noqa: E402

NAMES = 1000  # registered in every worker of every shape


def fill(url: str, shape: str, jobs: int) -> None:
    kind, _, spec = shape.partition(":")
    if kind == "names":
        names, rows = (int(part) for part in spec.split("x"))
        values = f"'bench.spread' || (g % {names}), 0, 'default'"
        jobs = names * rows
    elif kind == "priorities":
        values = f"'bench.spread0', g % {int(spec)}, 'default'"
    elif kind == "queues":
        values = f"'bench.spread0', 0, 'q' || (g % {int(spec)})"
    else:
        raise SystemExit(f"unknown shape {shape!r}")
    with connect(url) as conn:
        conn.execute("TRUNCATE axa_queue, axa_history, axa_worker CASCADE")
        conn.execute(
            f"INSERT INTO axa_queue (id, name, priority, queue, args) "
            f"SELECT gen_random_uuid(), {values}, '{{}}' FROM generate_series(0, {jobs} - 1) g"
        )
        conn.execute("VACUUM ANALYZE axa_queue")
        conn.execute("CHECKPOINT")


def drain(url: str, worker_args: list[str], pg_pid: int) -> tuple[float, float, float, int]:
    """Seconds from the first job's start to the last one's end; the worker's CPU and the server's
    over its whole run (start-up included), in seconds; and the jobs completed."""
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT), BENCH_SPREAD_NAMES=str(NAMES))
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    before = Sample([], pg_pid)
    done = subprocess.run(
        [sys.executable, "-m", "django", "runworker", *worker_args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    after = Sample([], pg_pid)
    if done.returncode != 0:
        raise SystemExit(f"runworker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    worker_cpu = (os.times().children_user + os.times().children_system) - drain.children
    drain.children += worker_cpu
    with connect(url) as conn:
        completed, elapsed = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8 "
            "FROM axa_history WHERE status = 'completed'"
        ).fetchone()
        (left,) = conn.execute("SELECT count(*) FROM axa_queue WHERE status <> 'completed'").fetchone()
    if left:
        raise SystemExit(f"{left} job(s) not completed")
    return elapsed, worker_cpu, after.pg - before.pg, completed


drain.children = 0.0  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="names:1x100000,names:100x1000,names:1000x100,priorities:20,queues:50")
    parser.add_argument("--worker-args", default="--burst --concurrency 1")
    parser.add_argument("--pg-pid", type=int, default=0, help="the server's postmaster pid, for its CPU")
    parser.add_argument("--db", default="axa_bench_spread")
    args = parser.parse_args()
    base = os.environ.get("DATABASE_URL")
    if not base:
        raise SystemExit("set DATABASE_URL")
    url = migrated_database(base, args.db)
    info = server_info(url)
    pg_pid = args.pg_pid or info["pg_pid"]
    print(f"server: PostgreSQL {info['version']}, {info['connection']}; runworker {args.worker_args}")
    print("shape                  jobs     jobs/s   worker ms/job   PostgreSQL ms/job")
    for _ in range(args.rounds):
        for shape in args.shapes.split(","):
            fill(url, shape, args.jobs)
            elapsed, worker_cpu, pg_cpu, completed = drain(url, shlex.split(args.worker_args), pg_pid)
            print(
                f"{shape:<20} {completed:>7} {completed / elapsed:>10.0f} {worker_cpu / completed * 1000:>15.4f} "
                f"{pg_cpu / completed * 1000:>19.4f}",
                flush=True,
            )
    with connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
