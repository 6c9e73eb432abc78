"""This machine's ceiling for the schema: pgbench running the worker's own claim and finish.

    DATABASE_URL=postgresql://... python benchmarks/ceiling.py [--jobs 100000] [--batch 256] [--clients 1,2]

No worker, no Python between the statements: each pgbench transaction claims up to
--batch ready no-op rows with the plain claim a draining worker runs (``sql.CLAIM_LANES``:
its one lane walked from its floor, worker/lanes.py) and finishes them with
``sql.FINISH_COMPLETED`` (moved to the history), in two transactions, as a worker's
dispatcher and finisher do. The statements are the package's own text, rendered here
and written to a pgbench script beside the results (``--keep``). What one worker
process drains, divided by this figure, says how much of the machine's limit for these
statements the worker's own cost leaves.

Each client count runs on a fresh table of --jobs ready rows (VACUUM ANALYZE after the
INSERT, a CHECKPOINT before the run) until they are all drained; the figure is jobs/s,
with PostgreSQL's CPU per job when the server is on this machine. Every row must end in
the history, completed once.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks import measure  # noqa: E402
from benchmarks.run import connect, migrated_database, server_info  # noqa: E402

NAME = "benchmarks.benchapp.jobs.noop"
WORKER = uuid.UUID("00000000-0000-4000-8000-00000000ce11")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000, help="ready rows per run (default 100000)")
    parser.add_argument("--batch", type=int, default=256, help="rows per claim (default 256)")
    parser.add_argument("--clients", default="1,2", help="pgbench clients, one run each (default 1,2)")
    parser.add_argument("--db", default="axa_bench_ceiling", help="database made for the runs (dropped first)")
    parser.add_argument("--keep", type=Path, help="write the pgbench script here")
    return parser.parse_args()


def pgbench_text(statement: str) -> str:
    """A psycopg statement as pgbench reads it: %(name)s as :name, %% as %, lines kept (SQL joins
    string constants across a newline only), blank lines dropped."""
    text = re.sub(r"%\((\w+)\)s", r":\1", statement).replace("%%", "%")
    return "\n".join(line for line in text.strip().splitlines() if line.strip())


# The claim's output columns (sql.claims.CLAIM_RETURNING).
_CLAIMED = "id, name, args, attempts, max_attempts, backend, unstarted, priority, run_at, flush, timeout, at"


def script() -> str:
    """The pgbench script: one claim of :batch rows from the lane's floor, then their finish, each its
    own transaction. The floor (the newest run_at claimed, as worker/lanes.py keeps it for one
    client whose rows were all written before) is kept in the client's session (axa.floor)."""
    import django

    django.setup()
    from axa_django import sql

    worker = f"'{WORKER}'::uuid"  # pgbench variables hold numbers only
    # CLAIM_LANES without its snapshot row (the worker's floors bookkeeping), which cannot sit in a CTE.
    claim = sql.compose(sql.CLAIM.replace("{walks}", "{lane_walks}"), [NAME], [], None, lanes=[0])
    claim = claim.replace("%(limit)s", ":batch").replace("%(ahead)s", "false").replace("%(worker)s", worker)
    # One floor per segment of the walk (sql.segments): the gap above priority 0, its lane, the gap below.
    floor = "COALESCE(NULLIF(current_setting('axa.floor', true), ''), '-infinity')::timestamptz"
    claim = claim.replace("%(floors)s", f"ARRAY[NULL, {floor}, NULL]")
    finish = sql.FINISH_COMPLETED.replace("%(ids)s", ":ids").replace("%(started)s", ":started")
    finish = finish.replace("%(worker)s", worker)
    return "\n".join(
        [
            "\\set batch {batch}",
            f"WITH c({_CLAIMED}) AS (" + pgbench_text(claim) + ")\n"
            "SELECT COALESCE(array_agg(id) FILTER (WHERE id IS NOT NULL), '{}')::text AS ids, "
            "COALESCE(array_agg(at) FILTER (WHERE id IS NOT NULL), '{}')::text AS started, "
            "set_config('axa.floor', COALESCE((max(run_at) AT TIME ZONE 'UTC')::text, "
            "current_setting('axa.floor', true)), false) AS floor FROM c \\gset",
            pgbench_text(finish) + ";",
            "",
        ]
    )


def fill(url: str, jobs: int) -> None:
    with connect(url) as conn:
        conn.execute("TRUNCATE axa_queue, axa_history CASCADE")
        conn.execute(
            "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), %s, '{}' FROM generate_series(1, %s)",
            [NAME, jobs],
        )
    with connect(url) as conn:
        conn.execute("VACUUM ANALYZE axa_queue")
        conn.execute("CHECKPOINT")


def main() -> None:
    args = parse_args()
    base = os.environ.get("DATABASE_URL")
    if not base:
        raise SystemExit("set DATABASE_URL to the server to measure (durable, over TCP, as docs/performance.md says)")
    url = migrated_database(base, args.db)
    text = script().replace("{batch}", str(args.batch))
    path = args.keep or Path(tempfile.mkstemp(prefix="axa-ceiling-", suffix=".sql")[1])
    path.write_text(text)
    info = server_info(url)
    print(
        f"server: PostgreSQL {info['version']}, {info['connection']}, fsync {info['fsync']}, "
        f"synchronous_commit {info['synchronous_commit']}; {args.jobs} jobs, claims of {args.batch}"
    )
    for clients in [int(c) for c in args.clients.split(",")]:
        fill(url, args.jobs)
        transactions = -(-args.jobs // (args.batch * clients)) + 1  # one more each: the last claims find none
        cpu = measure.tree_cpu([info["pg_pid"]]) if info["pg_pid"] else None
        start = time.monotonic()
        subprocess.run(
            [
                "pgbench",
                "-n",
                "-M",
                "prepared",
                "-f",
                str(path),
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-t",
                str(transactions),
                url,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - start
        used = measure.tree_cpu([info["pg_pid"]]) - cpu if cpu is not None else None
        with connect(url) as conn:
            left = conn.execute("SELECT count(*) FROM ONLY axa_queue").fetchone()[0]
            done, once = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'completed'), count(DISTINCT id) FROM axa_history"
            ).fetchone()
        if left or done != args.jobs or once != args.jobs:
            raise SystemExit(f"{clients} clients: {left} rows left, {done} completed, {once} distinct in the history")
        per_job = f", PostgreSQL CPU {used / args.jobs * 1e3:.4f} ms a job" if used is not None else ""
        print(f"{clients} client(s): {args.jobs / seconds:,.0f} jobs/s ({seconds:.2f} s){per_job}")
    if not args.keep:
        path.unlink()
    with connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
