"""How fast one worker drains the same no-op jobs spread over job names, priorities or queues (issue 46).

    DATABASE_URL=postgresql://... python benchmarks/spread.py [--jobs 100000] [--rounds 2]
        [--shapes names:1x100000,names:100x1000,names:1000x100,priorities:20,queues:50]
        [--worker-args "--burst --concurrency 1"] [--processes 1,4] [--start-first]

Each shape fills a fresh ``axa_bench_spread`` database with --jobs ready no-op rows (one
INSERT, as a bulk enqueue writes them) and times ``runworker`` (with --worker-args) from
the first job's start to the last one's end (their rows' times; --burst: it stops once
none is left), every worker process serving
the same 1,000 registered names (BENCH_SPREAD_NAMES) whatever the shape, and samples the
PostgreSQL server's CPU (its processes' user + system time) over the drain, the backends
waiting on a lock (mean per 20 ms sample), the most connections and (with --start-first)
the WAL written a job. --processes starts
that many workers on each drain. With --start-first (and --worker-args without --burst)
the workers start on the empty table and the rows are written once all have registered
and beaten once (a running fleet): the CPU figures then leave the start-ups out. Rounds run the shapes interleaved; each
line is one drain:

- ``names:NxR``: N names of R jobs each, priority 0, the default queue;
- ``priorities:P``: one name, its jobs spread evenly over priorities 0..P-1;
- ``queues:Q``: one name, spread over Q queues; an all-queues worker, or with --per-queue
  Q workers, one ``--new-queue qN`` each (--processes is then ignored for that shape), or
  with --pools one process of Q per-queue pools of one thread (``--new-queue qN:1`` each).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

from benchmarks.measure import Sample, local_ports, process_cpu, wait_until  # noqa: E402
from benchmarks.run import base_url, connect, migrated_database, server_info  # noqa: E402

NAMES = 1000  # registered in every worker of every shape


def rows(shape: str, jobs: int, counted: bool = True) -> tuple[str, int]:
    """The INSERT that writes ``shape``'s ready rows, and how many; ``counted`` False: ``jobs`` rows
    even for names:NxR (which otherwise says its own count), spread over its N names alike."""
    kind, _, spec = shape.partition(":")
    if kind == "names":
        names, rows = (int(part) for part in spec.split("x"))
        values = f"'bench.spread' || (g % {names}), 0, 'default'"
        jobs = names * rows if counted else jobs
    elif kind == "priorities":
        values = f"'bench.spread0', g % {int(spec)}, 'default'"
    elif kind == "queues":
        values = f"'bench.spread0', 0, 'q' || (g % {int(spec)})"
    else:
        raise SystemExit(f"unknown shape {shape!r}")
    insert = (
        f"INSERT INTO axa_queue (id, name, priority, queue, args) "
        f"SELECT gen_random_uuid(), {values}, '{{}}' FROM generate_series(0, {jobs} - 1) g"
    )
    return insert, jobs


def fill(url: str, shape: str, jobs: int, now: bool = True) -> int:
    """Empty the tables; write the shape's rows unless ``now`` is False (then only prepare); the rows' count."""
    insert, count = rows(shape, jobs)
    with connect(url) as conn:
        conn.execute("TRUNCATE axa_queue, axa_history, axa_worker CASCADE")
        if now:
            conn.execute(insert)
        conn.execute("VACUUM ANALYZE axa_queue")
        conn.execute("CHECKPOINT")
    return count


class Watch(threading.Thread):
    """Samples the server every 20 ms while the drain runs: backends waiting on a lock, and connections.

    For each wait it also keeps who waited on whom (the two connections' application names,
    their statements' first words and the wait event): ``waits_on`` counts those pairs."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.samples = self.lock_waits = self.most_connections = 0
        self.waits_on: collections.Counter[str] = collections.Counter()
        self.events: collections.Counter[str] = collections.Counter()  # what active backends waited on

    def run(self) -> None:
        with connect(self.url) as conn:
            while not self.stop.is_set():
                waiting, connections = conn.execute(
                    "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
                self.samples += 1
                self.lock_waits += waiting
                self.most_connections = max(self.most_connections, connections)
                if waiting:
                    for (pair,) in conn.execute(WAITS_ON):
                        self.waits_on[pair] += 1
                for event, count in conn.execute(EVENTS):
                    self.events[event] += count
                self.stop.wait(0.02)


EVENTS = """
SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU'), count(*) FROM pg_stat_activity
WHERE state = 'active' AND datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1
"""
# Each backend waiting on a lock, with what holds it: "waiter (event) <- blocker".
WAITS_ON = """
SELECT w.application_name || ' ' || left(regexp_replace(w.query, '\\s+', ' ', 'g'), 60)
    || ' (' || w.wait_event || ') <- ' || coalesce(b.application_name || ' ' || b.state || ' '
    || left(regexp_replace(b.query, '\\s+', ' ', 'g'), 60), '?')
FROM pg_stat_activity w
LEFT JOIN pg_stat_activity b ON b.pid = (pg_blocking_pids(w.pid))[1]
WHERE w.wait_event_type = 'Lock' AND w.datname = current_database()
"""


def server_processes(pg_pid: int) -> dict[int, float]:
    """CPU seconds of each of the server's processes (the postmaster's children)."""
    children = [int(pid) for pid in Path(f"/proc/{pg_pid}/task/{pg_pid}/children").read_text().split()]
    return {pid: cpu for pid in children if (cpu := process_cpu(pid)) is not None}


def ended(proc: subprocess.Popen[str], log: Any) -> tuple[int, str]:
    """A worker's exit code and what it logged, once it exits."""
    code = proc.wait()
    with log:
        log.seek(0)
        return code, log.read()


def perf(fifo: str, command: str) -> None:
    """Tell ``perf record -D -1 --control fifo:FIFO`` to start or stop sampling (the drain's window alone)."""
    if fifo:
        with open(fifo, "w") as ctl:
            ctl.write(command + "\n")


def drain(
    url: str,
    worker_args: list[str] | list[list[str]],
    processes: int,
    pg_pid: int,
    insert: str | None,
    statements: int = 0,
    root: Path = ROOT,
    warm: str | None = None,
    perf_ctl: str = "",
    registered: int = 0,
    pooler: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``processes`` workers on the rows: seconds from the first job's start to the last one's end,
    the workers' CPU and the server's, the jobs completed, lock waits per sample and the most
    connections seen. ``insert`` None: burst workers on the rows written, CPU over their whole run
    (start-ups included); else workers started on the empty table, and once all have registered and beaten,
    the rows written by ``insert``: CPU from its commit to the last job's end (then the workers stop),
    and their own backends' CPU apart (``backends_cpu``). ``warm``: rows the started workers drain first,
    left out of every figure (a fleet that has run jobs before: plans made, caches filled). ``registered``:
    the worker rows to wait for (per-queue pools: one a pool), by default one a process. ``pooler``:
    (port, pid) of a PgBouncer in transaction mode on this host that the workers reach the server through."""
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(root), BENCH_SPREAD_NAMES=str(NAMES))
    env["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    if pooler is not None:
        parts = urlsplit(url)  # the same user, password and database, on the pooler's port
        netloc = f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{pooler[0]}"
        env.update(DATABASE_URL=urlunsplit(parts._replace(netloc=netloc, query="")), AXA_BENCH_TRANSACTION_POOLING="1")
    # One argument list for every process, or one list each (--per-queue).
    each = worker_args if worker_args and isinstance(worker_args[0], list) else [worker_args] * processes
    commands = [[sys.executable, "-m", "django", "runworker", *own] for own in each]
    watch = Watch(url)
    if statements:
        with connect(url) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")
    # Their logs go to files: one process of 50 per-queue pools filled a pipe's buffer with its start-up
    # lines while nothing read it, and stalled. Left running by a failed drain, they are ended at exit.
    logs = [tempfile.TemporaryFile("w+") for _ in commands]  # noqa: SIM115 - read and closed in ended()
    procs = [
        subprocess.Popen(command, cwd=root, env=env, stderr=log, text=True)
        for command, log in zip(commands, logs, strict=True)
    ]
    atexit.register(lambda: [proc.kill() for proc in procs if proc.poll() is None])
    processes = len(procs)
    # The pooler's CPU counts as the workers' (their cost on this side), its server connections as theirs.
    pids = [proc.pid for proc in procs] + ([pooler[1]] if pooler is not None else [])
    if insert is not None:
        with connect(url) as conn:
            # Registered and beaten once each: a running fleet, each worker knowing its size.
            beaten = "SELECT count(*) FROM axa_worker WHERE heartbeat_at > started_at"
            expected = registered or processes
            wait_until(lambda: conn.execute(beaten).fetchone()[0] >= expected, 120, "a beat of every worker")
            warmed = 0
            if warm is not None:
                conn.execute(warm)
                warmed = conn.execute("SELECT count(*) FROM axa_queue").fetchone()[0]
                history = "SELECT count(*) FROM axa_history"
                wait_until(lambda: conn.execute(history).fetchone()[0] >= warmed, 600, "the warm-up's jobs")
            # The counters are read before the rows are committed, while the workers wait:
            # read after, on two cores busy with 50 workers, this process got the CPU to read
            # them seconds into the drain, and most of its cost went uncounted.
            with conn.transaction():
                (since,) = conn.execute("SELECT statement_timestamp()").fetchone()  # before the rows' created_at
                conn.execute(insert)
                total = conn.execute("SELECT count(*) FROM ONLY axa_queue").fetchone()[0] + warmed
                (wal_before,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
                before = Sample(pids, pg_pid)
                perf(perf_ctl, "enable")
                # Every server process's CPU now: the workers' own backends are picked out at the
                # end (by their sockets), apart from autovacuum, the checkpointer and the WAL writer.
                server_before = server_processes(pg_pid)
    else:
        before, server_before, since = Sample([], pg_pid), {}, None
    children = os.times().children_user + os.times().children_system
    watch.start()
    if insert is not None:
        with connect(url) as conn:
            done = "SELECT count(*) FROM axa_history"
            wait_until(lambda: conn.execute(done).fetchone()[0] >= total, 1800, "every job", step=0.02)
            (wal,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)::float8", [wal_before]).fetchone()
        after = Sample(pids, pg_pid)
        perf(perf_ctl, "disable")
        with connect(url) as conn:
            ports = sorted(local_ports(pids))
            found = conn.execute("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", [ports])
            mine = [pid for (pid,) in found]
        # None over a Unix socket (no port names the workers' backends).
        backends = sum((process_cpu(pid) or 0.0) - server_before.get(pid, 0.0) for pid in mine) if mine else None
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
    failed = [ended(proc, log) for proc, log in zip(procs, logs, strict=True)]
    watch.stop.set()
    watch.join()
    if insert is None:
        after = Sample([], pg_pid)
    for code, errors in failed:
        if code != 0:
            raise SystemExit(f"runworker failed ({code}):\n{errors[-3000:]}")
    with connect(url) as conn:
        completed, elapsed = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM axa_history "
            "WHERE status = 'completed' AND (created_at >= %s::timestamptz OR %s::timestamptz IS NULL)",
            [since, since],
        ).fetchone()
        (left,) = conn.execute("SELECT count(*) FROM axa_queue WHERE status <> 'completed'").fetchone()
        (twice,) = conn.execute("SELECT count(*) FROM axa_history WHERE attempts <> 1").fetchone()
        top = conn.execute(TOP_STATEMENTS, [statements]).fetchall() if statements else []
    if left or twice:
        raise SystemExit(f"{left} job(s) not completed, {twice} run more than once")
    return {
        "elapsed": elapsed,
        "worker_cpu": (after.workers - before.workers)
        if insert is not None
        else os.times().children_user + os.times().children_system - children,
        "pg_cpu": after.pg - before.pg,
        "backends_cpu": backends if insert is not None else None,
        "wal": wal if insert is not None else None,
        "completed": completed,
        "lock_waits": watch.lock_waits / max(watch.samples, 1),
        "connections": watch.most_connections,
        "waits_on": watch.waits_on,
        "events": {event: count / max(watch.samples, 1) for event, count in watch.events.most_common(6)},
        "statements": top,
    }


# The statements that took the server's time over a drain (--statements; the extension
# must be loaded and created in the database): calls, ms, buffers and rows a call, and
# plans and their ms a call (0 unless pg_stat_statements.track_planning is on).
TOP_STATEMENTS = """
SELECT calls, total_exec_time / calls, (shared_blks_hit + shared_blks_read) / calls, rows / calls,
    plans, total_plan_time / greatest(plans, 1), left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time + total_plan_time DESC LIMIT %s
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", default="names:1x100000,names:100x1000,names:1000x100,priorities:20,queues:50")
    parser.add_argument("--worker-args", default="--burst --concurrency 1")
    parser.add_argument("--processes", default="1", help="worker processes per drain, comma separated (default 1)")
    parser.add_argument(
        "--start-first",
        action="store_true",
        help="start the workers (give --worker-args without --burst) on the empty table, then write the rows: "
        "CPU from then on, start-ups left out",
    )
    parser.add_argument(
        "--per-queue",
        action="store_true",
        help="queues:Q shapes: Q workers, each --new-queue qN (a queue still empty), instead of --processes",
    )
    parser.add_argument(
        "--pools",
        action="store_true",
        help="queues:Q shapes: one process of Q per-queue pools of one thread (--new-queue qN:1 each)",
    )
    parser.add_argument("--pg-pid", type=int, default=0, help="the server's postmaster pid, for its CPU")
    parser.add_argument("--db", default="axa_bench_spread")
    parser.add_argument(
        "--statements",
        type=int,
        default=0,
        help="after each drain, the N statements that took the server's time (pg_stat_statements loaded)",
    )
    parser.add_argument(
        "--worker-root",
        type=Path,
        default=ROOT,
        help="run the workers from this checkout (an A/B of the worker's code under the same harness)",
    )
    parser.add_argument(
        "--pooler",
        default="",
        help="PORT:PID of a PgBouncer in transaction mode on this host (its [databases] reaching the server): "
        "the workers connect through it with TRANSACTION_POOLING on; its CPU counts as theirs",
    )
    parser.add_argument("--waits", type=int, default=0, help="after each drain, the N commonest lock waits")
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="with --start-first: N jobs of the shape drained first and left out (a fleet that has run jobs before)",
    )
    parser.add_argument(
        "--schema-sql",
        default="",
        help="SQL run once on the migrated database before the drains: an experiment on the schema "
        "(say what it was beside its figures)",
    )
    parser.add_argument(
        "--perf-ctl",
        default="",
        help="with --start-first: the FIFO of `perf record -D -1 --control fifo:FIFO`, sampling each drain alone",
    )
    args = parser.parse_args()
    base = base_url()
    url = migrated_database(base, args.db)
    if args.schema_sql:
        with connect(url) as conn:
            conn.execute(args.schema_sql)
        print(f"schema changed for this run: {args.schema_sql}")
    info = server_info(url)
    if args.statements:
        with connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    pg_pid = args.pg_pid or info["pg_pid"]
    print(f"server: PostgreSQL {info['version']}, {info['connection']}; runworker {args.worker_args}")
    print("shape                processes    jobs     jobs/s   worker ms/job   PostgreSQL ms/job", end="")
    print("   lock waits   connections   backends ms/job   WAL bytes/job")
    for _ in range(args.rounds):
        for shape in args.shapes.split(","):
            counts = [int(n) for n in args.processes.split(",")]
            per_queue = args.per_queue and shape.startswith("queues:")
            pools = int(shape.partition(":")[2]) if args.pools and shape.startswith("queues:") else 0
            for processes in [int(shape.partition(":")[2])] if per_queue else [1] if pools else counts:
                fill(url, shape, args.jobs, now=not args.start_first)
                insert = rows(shape, args.jobs)[0] if args.start_first else None
                worker_args: list[str] | list[list[str]] = shlex.split(args.worker_args)
                if per_queue:
                    worker_args = [[*shlex.split(args.worker_args), "--new-queue", f"q{n}"] for n in range(processes)]
                if pools:
                    worker_args = [*worker_args, *(arg for n in range(pools) for arg in ("--new-queue", f"q{n}:1"))]
                warm = rows(shape, args.warm, counted=False)[0] if args.warm and args.start_first else None
                run = drain(
                    url,
                    worker_args,
                    processes,
                    pg_pid,
                    insert,
                    args.statements,
                    args.worker_root.resolve(),
                    warm,
                    args.perf_ctl,
                    pools,
                    tuple(int(part) for part in args.pooler.split(":")) if args.pooler else None,  # type: ignore[arg-type]
                )
                done = run["completed"]
                label = f"{shape} per queue" if per_queue else f"{shape} pools" if pools else shape
                print(
                    f"{label:<20} {processes:>9} {done:>7} {done / run['elapsed']:>10.0f} "
                    f"{run['worker_cpu'] / done * 1000:>15.4f} {run['pg_cpu'] / done * 1000:>19.4f} "
                    f"{run['lock_waits']:>12.2f} {run['connections']:>13}"
                    + (f" {run['backends_cpu'] / done * 1000:>17.4f}" if run["backends_cpu"] is not None else "")
                    + (f" {run['wal'] / done:>15.0f}" if run["wal"] is not None else ""),
                    flush=True,
                )
                for calls, ms, buffers, got, plans, plan_ms, query in run["statements"]:
                    print(
                        f"    {calls:>8} calls {ms:>8.3f} ms {buffers:>8.0f} buffers {got:>6.0f} rows "
                        f"{plans:>8} plans {plan_ms:>6.3f} ms  {query}"
                    )
                if args.waits:
                    print(
                        "    active backends a sample: " + ", ".join(f"{e} {n:.2f}" for e, n in run["events"].items())
                    )
                for pair, count in run["waits_on"].most_common(args.waits):
                    print(f"    {count:>6} waits  {pair}")
    with connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)')


if __name__ == "__main__":
    main()
