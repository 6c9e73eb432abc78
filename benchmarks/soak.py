#!/usr/bin/env python
"""Soak: a steady enqueue rate into one worker for minutes, a snapshot held open, watched every 10 s.

    DATABASE_URL=postgresql://postgres:postgres@127.0.0.1:5432/postgres \\
        python benchmarks/soak.py --minutes 10 --rate 1000 --hold-snapshot [--peer pgqueuer]

A producer process enqueues no-op jobs --batch at a time (default 10: one call every 10 ms
at 1,000 jobs/s) on a fixed schedule into axa-django, whose one ``runworker`` runs at its
defaults, or into the peer (pgqueuer: ``pgq run`` at its defaults). After --warmup s, with
--hold-snapshot, another connection runs ``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1
FROM <jobs table> LIMIT 1`` and stays idle in that transaction until the end (or until
--release-at s). Every --interval s one line: enqueued and done per second, the backlog
(queued rows), pickup p50/p99 (enqueue call to the job's own start record), the jobs
table's dead tuples and index size, and EXPLAIN (ANALYZE, BUFFERS) of the worker's real
claim, rolled back. The run ends with the last minute against the first one after the
warm-up, the CPU per job, and a count of jobs lost or run twice (after a bounded drain).
The database (<--db-prefix><tool>) is made fresh and dropped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql as pgsql  # noqa: E402

from benchmarks import measure, venvs  # noqa: E402
from benchmarks.run import connect, fresh_database, server_info  # noqa: E402
from benchmarks.soak_tool import SENT_LINE  # noqa: E402

PEERS = ["pgqueuer"]
# How each worker plans its claim: runworker forces generic plans on its session
# (axa_django/workerdb.py); asyncpg prepares the dequeue and PostgreSQL chooses.
PLAN_CACHE_MODE = {"axa": "force_generic_plan", "pgqueuer": "auto"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
PR_SET_PDEATHSIG = 1
MAX_JOBS = 99_999_999  # job ids are 8 digits in the jobs' records (benchmarks/measure.py)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run, warm-up included (default 10)")
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs enqueued per second (default 1000)")
    parser.add_argument("--batch", type=int, default=10, help="jobs per enqueue call (default 10; 1: one at a time)")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the snapshot (default 60)")
    parser.add_argument("--hold-snapshot", action="store_true", help="hold a REPEATABLE READ snapshot after warm-up")
    parser.add_argument("--release-at", type=float, help="release the snapshot at this second (default: the end)")
    parser.add_argument("--peer", choices=PEERS, help="soak this peer instead of axa-django")
    parser.add_argument(
        "--retention", type=float, help="axa-django: the worker's RETENTION in seconds (default: none, history kept)"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per printed line (default 10)")
    parser.add_argument("--claim-limit", type=int, help="jobs per EXPLAINed claim (default: axa 4, pgqueuer 10)")
    parser.add_argument(
        "--drain-timeout", type=float, default=120.0, help="at the end, wait this long for the backlog (default 120)"
    )
    parser.add_argument(
        "--table", action="append", default=[], help="also count this table's dead tuples and indexes (repeatable)"
    )
    parser.add_argument("--db-prefix", default="axa_soak_", help="the database is <prefix><tool> (default axa_soak_)")
    parser.add_argument("--peer-python", help="Python >= 3.12 for the peer's venv (default: found on PATH/pyenv)")
    parser.add_argument("--json", help="output file (default benchmarks/results/soak-<tool>.json)")
    args = parser.parse_args(argv)
    total = args.minutes * 60
    if args.rate <= 0 or args.batch < 1 or args.interval <= 0:
        parser.error("--rate and --interval must be above 0 and --batch at least 1")
    if args.rate * total > MAX_JOBS:
        parser.error(f"--rate x --minutes makes more than {MAX_JOBS:,} jobs; the jobs' records hold 8-digit ids")
    if not 0 <= args.warmup < total:
        parser.error(f"--warmup must be at least 0 and less than the run ({total:g} s); got {args.warmup:g}")
    if args.release_at is not None and not args.hold_snapshot:
        parser.error("--release-at needs --hold-snapshot")
    if args.retention is not None and (args.peer or args.retention <= 0):
        parser.error("--retention is a positive number of seconds, for axa-django (a peer keeps its own history)")
    if args.release_at is not None and not args.warmup < args.release_at < total:
        parser.error(f"--release-at must fall after the warm-up ({args.warmup:g} s) and before the end ({total:g} s)")
    for name, value in (("--minutes x 60", total), ("--warmup", args.warmup), ("--release-at", args.release_at)):
        if value is not None and abs(value / args.interval - round(value / args.interval)) > 1e-6:
            parser.error(f"{name} ({value:g} s) must be a multiple of --interval ({args.interval:g} s)")
    if args.claim_limit is not None and args.claim_limit < 1:
        parser.error("--claim-limit must be at least 1")
    return args


def require_local(url: str) -> None:
    """Refuse a server that is not on this machine: the soak sends traffic to 127.0.0.1 only."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    host = ",".join(str(params.get(key) or "") for key in ("host", "hostaddr")).strip(",")
    hosts = [h for h in host.split(",") if h]
    if any(not (h.startswith("/") or h in LOCAL_HOSTS) for h in hosts):
        raise SystemExit(
            f"soak: DATABASE_URL names host {host!r}; the soak runs against a server on this machine only "
            "(127.0.0.1, localhost, ::1 or a Unix socket)"
        )


@dataclass
class Interval:
    """One printed line's figures."""

    t: float
    phase: str
    enqueued_per_s: float
    done_per_s: float
    backlog: int | None
    pickups: list[float] = field(repr=False)
    dead_tuples: int | None = None
    live_tuples: int | None = None
    index_bytes: int | None = None
    # The ready set's indexes: those of the jobs table(s) whose predicate keeps queued rows
    # (it names 'queued', and not as "NOT status = 'queued'"), apart from the history's;
    # each index's size by name.
    ready_index_bytes: int | None = None
    index_sizes: dict[str, int] = field(default_factory=dict)
    table_bytes: int | None = None
    claim_buffers: int | None = None
    claim_ms: float | None = None
    claim_indexes: list[str] | None = None
    # The real claims' walk, from the server's counters: the index of the jobs table that
    # returned the most entries in the interval, and its entries per scan (a dead entry
    # counts: it is read before its row is found dead).
    walk_index: str | None = None
    walk_per_scan: float | None = None
    worker_cores: float = 0.0
    pg_cores: float = 0.0  # the worker's own backends (over a Unix socket: the whole server)
    server_cores: float = 0.0  # every process of the server, whoever's work
    snapshot_xmin_age: int | None = None
    tables: dict[str, dict[str, int]] = field(default_factory=dict)

    def p(self, q: int) -> float | None:
        return percentile(self.pickups, q)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "pickups"}
        return {**out, "pickups": len(self.pickups), "p50_ms": self.p(50), "p99_ms": self.p(99)}


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Tail:
    """New complete fixed-width lines of a file that another process appends to."""

    def __init__(self, path: Path, width: int) -> None:
        self.path, self.width, self.offset = path, width, 0

    def read(self, peek: bool = False) -> list[str]:
        """The new lines; with ``peek``, read them again next time."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        whole = len(data) // self.width * self.width
        if not peek:
            self.offset += whole
        return data[:whole].decode().splitlines()


class Watch:
    """The monitoring session: the jobs table's figures and the claim's EXPLAIN, on its own connection."""

    def __init__(self, url: str, tool: str, tables: list[str], claim: list[Any] | None) -> None:
        # prepare_threshold None: psycopg's own prepared statements would make it DEALLOCATE ALL
        # (ours too) at the first ROLLBACK.
        self.conn = psycopg.connect(url, autocommit=True, application_name="axa soak monitor", prepare_threshold=None)
        self.conn.execute("SET statement_timeout = '20s'")
        self.tool, self.tables = tool, tables
        missing = [t for t in tables if self.conn.execute("SELECT to_regclass(%s)", [t]).fetchone()[0] is None]
        if missing:
            raise SystemExit(f"soak: no table {', '.join(missing)} in the benchmark's database; check --table")
        self.claim_args = ""
        if claim:
            text, literals = claim
            self.conn.execute(f"SET plan_cache_mode = {PLAN_CACHE_MODE[tool]}")
            self.conn.execute("PREPARE soak_claim AS " + text)  # no parameters: psycopg sends the text as it is
            self.claim_args = ", ".join(literals)
        self.backlog_sql = pgsql.SQL("SELECT count(*) FROM {} WHERE status = 'queued'").format(
            pgsql.Identifier(tables[0])
        )
        self.index_counters: dict[str, tuple[int, int]] = {}

    def index_walk(self, into: Interval) -> None:
        """The busiest index walk of the interval: entries read per scan, from pg_stat_user_indexes."""
        rows = self.conn.execute(
            "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes WHERE relname = ANY(%s)",
            [self.tables],
        ).fetchall()
        busiest: tuple[int, str, int] | None = None
        for name, scans, read in rows:
            before_scans, before_read = self.index_counters.get(name, (scans, read))
            self.index_counters[name] = (scans, read)
            if scans > before_scans and (busiest is None or read - before_read > busiest[0]):
                busiest = (read - before_read, name, scans - before_scans)
        if busiest is not None:
            into.walk_index, into.walk_per_scan = busiest[1], busiest[0] / busiest[2]

    def backlog(self) -> int:
        return self.conn.execute(self.backlog_sql).fetchone()[0]

    def table_figures(self, into: Interval) -> None:
        """Dead and live tuples and sizes of the jobs table (and its partitions), and of every table apart."""
        dead, live, indexes, size = self.conn.execute(
            "SELECT sum(s.n_dead_tup), sum(s.n_live_tup), sum(pg_indexes_size(p.relid)), sum(pg_table_size(p.relid)) "
            "FROM (SELECT DISTINCT relid FROM unnest(%s::text[]) AS q(name), LATERAL ("
            "  SELECT q.name::regclass AS relid UNION ALL SELECT relid FROM pg_partition_tree(q.name::regclass)"
            ") AS t) AS p LEFT JOIN pg_stat_user_tables s ON s.relid = p.relid",
            [self.tables],
        ).fetchone()
        into.dead_tuples, into.live_tuples = int(dead or 0), int(live or 0)
        into.index_bytes, into.table_bytes = int(indexes or 0), int(size or 0)
        ready = 0
        for name, size_of, partial in self.conn.execute(
            "SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid), "
            "COALESCE(pg_get_expr(i.indpred, i.indrelid) LIKE '%%''queued''%%' "
            "AND pg_get_expr(i.indpred, i.indrelid) NOT LIKE '%%NOT %%', false) "
            "FROM pg_index i WHERE i.indrelid IN (SELECT relid FROM unnest(%s::text[]) AS q(name), LATERAL ("
            "  SELECT q.name::regclass AS relid UNION ALL SELECT relid FROM pg_partition_tree(q.name::regclass)) AS t)",
            [self.tables],
        ):
            into.index_sizes[name] = int(size_of)
            ready += int(size_of) if partial else 0
        into.ready_index_bytes = ready
        for name, d, li, ib, vacuums in self.conn.execute(
            "SELECT relname, n_dead_tup, n_live_tup, pg_indexes_size(relid), autovacuum_count + vacuum_count "
            "FROM pg_stat_user_tables WHERE n_dead_tup + n_live_tup > 0 ORDER BY relname"
        ):
            into.tables[name] = {"dead": d, "live": li, "index_bytes": ib, "vacuums": vacuums}

    def explain_claim(self, into: Interval) -> None:
        """EXPLAIN (ANALYZE, BUFFERS) of the worker's claim in a transaction rolled back: it claims nothing."""
        if not self.claim_args:
            return
        with self.conn.transaction(force_rollback=True):
            (plan,) = self.conn.execute(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE soak_claim({self.claim_args})"
            ).fetchone()
        top = (json.loads(plan) if isinstance(plan, str) else plan)[0]
        into.claim_buffers = claim_buffers(top["Plan"])
        into.claim_ms = top["Execution Time"]
        into.claim_indexes = sorted(set(index_names(top["Plan"])))

    def xmin_age(self, pid: int) -> int | None:
        row = self.conn.execute("SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
        return row[0] if row else None

    def others(self) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in rows]

    def backends(self, ports: set[int]) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s) AND datname = current_database()",
            [sorted(ports)],
        )
        return [pid for (pid,) in rows]

    def close(self) -> None:
        self.conn.close()


def buffers(node: dict[str, Any]) -> int:
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def claim_buffers(plan: dict[str, Any]) -> int:
    """Shared buffers the statement read: the top node's, which count what ran under it, plus any
    data-modifying CTE no one scans (pgqueuer's log insert), which PostgreSQL runs after the top node."""
    scanned = set(cte_scans(plan))
    unscanned = [
        child
        for child in plan.get("Plans", [])
        if child.get("Parent Relationship") == "InitPlan"
        and child.get("Subplan Name", "").startswith("CTE ")
        and child["Subplan Name"][4:] not in scanned
    ]
    return buffers(plan) + sum(buffers(child) for child in unscanned)


def cte_scans(plan: dict[str, Any]) -> list[str]:
    names = [plan["CTE Name"]] if plan.get("Node Type") == "CTE Scan" else []
    for child in plan.get("Plans", []):
        names += cte_scans(child)
    return names


def index_names(plan: dict[str, Any]) -> list[str]:
    names = [plan["Index Name"]] if "Index Name" in plan else []
    for child in plan.get("Plans", []):
        names += index_names(child)
    return names


class BackendCpu:
    """CPU of the worker's own PostgreSQL backends (found by their client ports) since the first reading.

    A backend first seen later is a new connection of the worker: all of its CPU counts. One
    that ends between two readings loses what it spent since the last (a reconnect, rare).
    """

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.started = False

    def read(self, pids: list[int]) -> None:
        for pid in pids:
            cpu = measure.process_cpu(pid)
            if cpu is not None:
                self.first.setdefault(pid, cpu if not self.started else 0.0)
                self.last[pid] = cpu
        self.started = True

    def total(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


class Soak:
    """One run: its processes, files and connections, torn down by ``close`` whatever happened."""

    def __init__(self, args: argparse.Namespace, tool: str, python: str, url: str, tmp: Path) -> None:
        self.args, self.tool, self.python, self.url, self.tmp = args, tool, python, url, tmp
        self.record, self.sent = tmp / "record", tmp / "sent"
        self.worker: subprocess.Popen[bytes] | None = None
        self.producer: subprocess.Popen[bytes] | None = None
        self.producer_stopped = False
        self.holder: psycopg.Connection[Any] | None = None
        self.holder_pid = 0
        self.watch: Watch | None = None
        self.env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT), BENCH_RECORD=str(self.record))
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop("DJANGO_SETTINGS_MODULE", None)  # axa_peer sets benchmarks.settings
        if args.retention:
            self.env["AXA_BENCH_RETENTION"] = str(args.retention)
        self.tcp = args.connection.startswith("TCP")  # over a Unix socket the worker's backends are not told apart

    def tool_command(self, role: str, *extra: str) -> list[str]:
        return [self.python, str(ROOT / "benchmarks" / "soak_tool.py"), role, "--tool", self.tool, *extra]

    def setup(self) -> dict[str, Any]:
        out = self.tmp / "setup.json"
        extra = ["--out", str(out)]
        if self.args.claim_limit:
            extra += ["--claim-limit", str(self.args.claim_limit)]
        subprocess.run(self.tool_command("setup", *extra), cwd=ROOT, env=self.env, check=True, timeout=300)
        return json.loads(out.read_text())

    def start_worker(self, command: list[str]) -> None:
        env = dict(self.env, DJANGO_SETTINGS_MODULE="benchmarks.settings") if self.tool == "axa" else self.env
        # A session of its own: Ctrl-C reaches the soak alone, which stops the worker in order.
        with (self.tmp / "worker.log").open("wb") as log:
            self.worker = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True, preexec_fn=die_with_parent
            )

    def start_producer(self) -> None:
        a = self.args
        limit = a.minutes * 60 + 60
        extra = ["--rate", str(a.rate), "--batch", str(a.batch), "--limit", str(limit), "--sent", str(self.sent)]
        with (self.tmp / "producer.log").open("wb") as log:
            self.producer = subprocess.Popen(
                self.tool_command("produce", *extra),
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def check_alive(self) -> None:
        producer = None if self.producer_stopped else self.producer
        for name, proc in (("worker", self.worker), ("producer", producer)):
            if proc is not None and proc.poll() is not None:
                tail = (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"soak: the {name} exited with code {proc.returncode}:\n{tail}")

    def hold_snapshot(self, table: str) -> None:
        self.holder = psycopg.connect(self.url, autocommit=True, application_name="axa soak snapshot")
        # Held on purpose, whatever the server's timeout for idle transactions says.
        self.holder.execute("SET idle_in_transaction_session_timeout = 0")
        self.holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        self.holder.execute(pgsql.SQL("SELECT 1 FROM {} LIMIT 1").format(pgsql.Identifier(table)))
        self.holder_pid = self.holder.info.backend_pid

    def release_snapshot(self) -> None:
        if self.holder is not None:
            self.holder.execute("ROLLBACK")
            self.holder.close()
            self.holder = None

    def stop_producer(self) -> None:
        self.producer_stopped = True
        stop(self.producer, 30)

    def worker_backends(self) -> list[int]:
        """The worker's PostgreSQL backends (its sockets' ports in pg_stat_activity), none over a Unix socket."""
        self.check_alive()
        assert self.worker is not None and self.watch is not None
        return self.watch.backends(measure.local_ports([self.worker.pid])) if self.tcp else []

    def worker_connected(self) -> bool:
        """Whether a session other than the monitor's is open on the database (before the producer's)."""
        self.check_alive()
        assert self.watch is not None
        return bool(self.watch.others())

    def close(self) -> None:
        """Stop the producer and the worker if they still run, and close the connections."""
        stop(self.producer, 30)
        stop(self.worker, 30)
        for conn in (self.holder, self.watch.conn if self.watch else None):
            if conn is not None and not conn.closed:
                conn.close()


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when the soak dies, even by SIGKILL, so no worker outlives it (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


HEAD = (
    f"{'s':>6} {'enq/s':>7} {'done/s':>7} {'backlog':>9} {'p50 ms':>9} {'p99 ms':>9} {'dead tup':>10} "
    f"{'idx MB':>7} {'ready MB':>8} {'claim buf':>9} {'claim ms':>8} {'walk/scan':>9} {'cores wrk/pg':>12}"
)


def line(i: Interval) -> str:
    claim_buf = "-" if i.claim_buffers is None else f"{i.claim_buffers:,}"
    claim_ms = "-" if i.claim_ms is None else f"{i.claim_ms:.2f}"
    walk = "-" if i.walk_per_scan is None else f"{i.walk_per_scan:,.1f}"
    return (
        f"{i.t:>6.0f} {i.enqueued_per_s:>7,.0f} {i.done_per_s:>7,.0f} {i.backlog or 0:>9,} {ms(i.p(50)):>9} "
        f"{ms(i.p(99)):>9} {i.dead_tuples or 0:>10,} {(i.index_bytes or 0) / 2**20:>7.1f} "
        f"{(i.ready_index_bytes or 0) / 2**20:>8.2f} {claim_buf:>9} "
        f"{claim_ms:>8} {walk:>9} {i.worker_cores:>5.2f}/{i.pg_cores:<5.2f}  {i.phase}"
    )


@dataclass
class Reading:
    """CPU counters at one moment, the producer's beside measure.Sample's."""

    sample: measure.Sample
    producer: float
    backends: float  # BackendCpu.total()


class Run:
    """The run's clock and tallies: what was sent, what ran, and the intervals printed."""

    def __init__(self, soak: Soak, watch: Watch) -> None:
        self.soak, self.watch, self.args = soak, watch, soak.args
        self.sent_tail, self.record_tail = Tail(soak.sent, SENT_LINE), Tail(soak.record, measure.LINE)
        self.sent_at: dict[int, float] = {}  # batch number -> time just before its enqueue call
        self.unmatched: list[tuple[int, float]] = []  # runs read before their enqueue's line
        self.sent_total = 0
        self.done_total = 0
        self.intervals: list[Interval] = []
        self.notes: list[dict[str, Any]] = []
        self.backend_cpu = BackendCpu()
        self.last: Reading | None = None

    def read(self) -> tuple[int, int, list[float]]:
        """New enqueue calls and runs since the last read: (jobs sent, jobs run, their pickups in ms)."""
        sent = 0
        for text in self.sent_tail.read():
            first, count, at = text.split()
            self.sent_at[int(first) // self.args.batch] = float(at)
            sent += int(count)
        runs = [(int(i), float(start)) for i, start, _ in (text.split() for text in self.record_tail.read())]
        pickups = []
        waiting, self.unmatched = self.unmatched + runs, []
        for i, start in waiting:
            at = self.sent_at.get(i // self.args.batch)
            if at is None:
                self.unmatched.append((i, start))
            else:
                pickups.append((start - at) * 1000)
        self.sent_total += sent
        self.done_total += len(runs)
        return sent, len(runs), pickups

    def sample(self) -> Reading:
        """Read the CPU counters (and the worker's backends')."""
        worker, producer = self.soak.worker, self.soak.producer
        self.backend_cpu.read(self.soak.worker_backends())
        return Reading(
            measure.Sample([worker.pid] if worker else [], self.args.pg_pid),
            measure.tree_cpu([producer.pid]) if producer else 0.0,
            self.backend_cpu.total(),
        )

    def tick(self, t: float, span: float, phase: str) -> Interval:
        """Read and print one interval ending now, at ``t`` s into the run."""
        self.soak.check_alive()
        sent, done, pickups = self.read()
        now = self.sample()
        interval = Interval(t, phase, sent / span, done / span, None, pickups)
        if self.last is not None:
            before = self.last.sample
            wall = max(now.sample.wall - before.wall, 1e-9)
            interval.worker_cores = (now.sample.workers - before.workers) / wall
            own = now.backends - self.last.backends if self.soak.tcp else now.sample.pg - before.pg
            interval.pg_cores = own / wall
            interval.server_cores = (now.sample.pg - before.pg) / wall
        self.last = now
        try:
            interval.backlog = self.watch.backlog()
            self.watch.table_figures(interval)
            self.watch.index_walk(interval)
            self.watch.explain_claim(interval)
            if self.soak.holder is not None:
                interval.snapshot_xmin_age = self.watch.xmin_age(self.soak.holder_pid)
        except psycopg.Error as error:  # a slow statement (statement_timeout) leaves the figure out
            self.note(t, f"monitor: {type(error).__name__}: {error}".strip())
        self.intervals.append(interval)
        print(line(interval), flush=True)
        return interval

    def note(self, t: float, text: str) -> None:
        self.notes.append({"t": t, "note": text})
        print(f"{t:>6.0f} {text}", flush=True)


def window(intervals: list[Interval], start: float, end: float) -> list[Interval]:
    return [i for i in intervals if start < i.t <= end + 1e-6]


def compare(run: Run, total: float) -> dict[str, Any]:
    """The last minute after the warm-up against the first (shorter halves when the run is short)."""
    args = run.args
    span = min(60.0, (total - args.warmup) / 2)
    span = max(args.interval, math.floor(span / args.interval + 1e-6) * args.interval)  # never overlapping
    timed = [i for i in run.intervals if i.phase != "drain"]
    first = window(timed, args.warmup, args.warmup + span)
    last = window(timed, total - span, total)

    def figures(part: list[Interval]) -> dict[str, Any]:
        pickups = [p for i in part for p in i.pickups]
        claims = [i.claim_buffers for i in part if i.claim_buffers is not None]
        claim_ms = [i.claim_ms for i in part if i.claim_ms is not None]
        walks = [i.walk_per_scan for i in part if i.walk_per_scan is not None]
        seconds = len(part) * args.interval
        return {
            "from_s": part[0].t - args.interval if part else None,
            "to_s": part[-1].t if part else None,
            "p50_ms": percentile(pickups, 50),
            "p99_ms": percentile(pickups, 99),
            "buffers_per_claim": statistics.mean(claims) if claims else None,
            "claim_ms": statistics.mean(claim_ms) if claim_ms else None,
            "walk_per_scan": statistics.mean(walks) if walks else None,
            "ready_index_bytes": part[-1].ready_index_bytes if part else None,
            "index_bytes": part[-1].index_bytes if part else None,
            "enqueued_per_s": sum(i.enqueued_per_s for i in part) * args.interval / seconds if seconds else 0.0,
            "done_per_s": sum(i.done_per_s for i in part) * args.interval / seconds if seconds else 0.0,
        }

    a, b = figures(first), figures(last)
    end_backlog = timed[-1].backlog if timed else None
    out: dict[str, Any] = {"window_s": span, "first": a, "last": b, "backlog_at_end": end_backlog}
    out["p50_ratio"] = ratio(b["p50_ms"], a["p50_ms"])
    out["buffers_ratio"] = ratio(b["buffers_per_claim"], a["buffers_per_claim"])
    out["walk_ratio"] = ratio(b["walk_per_scan"], a["walk_per_scan"])
    out["ready_index_ratio"] = ratio(b["ready_index_bytes"], a["ready_index_bytes"])
    out["backlog_seconds_of_work"] = end_backlog / b["done_per_s"] if end_backlog and b["done_per_s"] else 0.0
    out["drained_over_enqueued_last"] = ratio(b["done_per_s"], b["enqueued_per_s"])
    if args.release_at is not None:
        out["recovery"] = recovery(run, a, args.release_at)
    return out


def recovery(run: Run, first: dict[str, Any], released: float) -> dict[str, Any]:
    """When, after the release, an interval was back to the first minute: p50 within 1.5x, backlog under 2 s."""
    for i in run.intervals:
        if i.t <= released or i.phase == "drain" or first["p50_ms"] is None:
            continue
        p50 = i.p(50)
        if p50 is not None and p50 <= 1.5 * first["p50_ms"] and (i.backlog or 0) <= 2 * run.args.rate:
            return {"released_s": released, "back_at_s": i.t, "after_s": i.t - released}
    return {"released_s": released, "back_at_s": None, "after_s": None}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def mb(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:,.2f}"


def times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}x"


def describe_compare(c: dict[str, Any], claim_note: str) -> str:
    a, b = c["first"], c["last"]
    span = f"{c['window_s']:g} s"
    head = "last minute vs first" if c["window_s"] == 60 else f"last {span} vs first {span} (a short run)"
    buffers = (
        f"buffers per claim {a['buffers_per_claim']:,.0f} -> {b['buffers_per_claim']:,.0f} "
        f"({times(c['buffers_ratio'])})"
        if a["buffers_per_claim"] is not None and b["buffers_per_claim"] is not None
        else f"buffers per claim n/a ({claim_note})"
    )
    walk = (
        f"entries per index scan {a['walk_per_scan']:,.1f} -> {b['walk_per_scan']:,.1f} ({times(c['walk_ratio'])})"
        if a["walk_per_scan"] is not None and b["walk_per_scan"] is not None
        else "entries per index scan n/a"
    )
    text = (
        f"{head} ({a['from_s']:g}-{a['to_s']:g} s vs {b['from_s']:g}-{b['to_s']:g} s): "
        f"pickup p50 {ms(a['p50_ms'])} -> {ms(b['p50_ms'])} ms ({times(c['p50_ratio'])}); {buffers}; {walk}; "
        f"ready-set indexes {mb(a['ready_index_bytes'])} -> {mb(b['ready_index_bytes'])} MB "
        f"({times(c['ready_index_ratio'])}); "
        f"backlog at end {c['backlog_at_end'] or 0:,} ({c['backlog_seconds_of_work']:,.1f} s of work at "
        f"{b['done_per_s']:,.0f} jobs/s); drained/enqueued in the last {span} "
        + ("n/a" if c["drained_over_enqueued_last"] is None else f"{c['drained_over_enqueued_last']:.2f}")
    )
    if "recovery" in c:
        r = c["recovery"]
        text += (
            f"; released at {r['released_s']:g} s: back to the first figures at {r['back_at_s']:g} s"
            f" ({r['after_s']:g} s later)"
            if r["back_at_s"] is not None
            else f"; released at {r['released_s']:g} s: not back to the first figures by the end"
        )
    return text


def soak(args: argparse.Namespace, soak_: Soak, info: dict[str, Any], results: dict[str, Any]) -> None:
    """Start the worker and the producer, tick to the end, drain, and fill ``results``."""
    total = args.minutes * 60
    table = info["table"]
    soak_.watch = watch = Watch(soak_.url, soak_.tool, [table, *args.table], info["claim"])
    run = Run(soak_, watch)
    results["intervals"] = run.intervals
    results["notes"] = run.notes
    soak_.start_worker(info["worker_command"])
    measure.wait_until(soak_.worker_connected, 120, "the worker to connect", step=0.1)
    soak_.start_producer()
    measure.wait_until(
        lambda: soak_.check_alive() or run.sent_tail.read(peek=True), 120, "the first enqueue", step=0.01
    )
    t0 = time.monotonic()
    assert soak_.worker is not None and soak_.producer is not None
    backends = f" ({len(soak_.worker_backends())} PostgreSQL backends)" if soak_.tcp else ""
    run.note(0, f"worker pid {soak_.worker.pid}{backends}, producer pid {soak_.producer.pid}")
    run.last = run.sample()
    start: tuple[Reading, int] | None = None

    def warmed_up(t: float) -> tuple[Reading, int]:
        reading = run.sample()
        if args.hold_snapshot:
            soak_.hold_snapshot(table)
            run.note(t, f"snapshot held: BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM {table} LIMIT 1")
        return reading, run.done_total

    if args.warmup == 0:
        start = warmed_up(0.0)
    steps = round(total / args.interval)
    for step in range(1, steps + 1):
        t = step * args.interval
        pause = t0 + t - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        phase = "warmup" if t <= args.warmup + 1e-6 else ("held" if soak_.holder is not None else "open")
        if step == steps:
            end = run.sample()  # before the producer stops: its CPU counts
            soak_.stop_producer()
        run.tick(t, args.interval, phase)
        if start is None and abs(t - args.warmup) < 1e-6:
            start = warmed_up(t)
        if args.release_at is not None and abs(t - args.release_at) < 1e-6:
            soak_.release_snapshot()
            run.note(t, "snapshot released")
    assert start is not None
    results["compare"] = compare(run, total)
    print(describe_compare(results["compare"], info["claim_missing"] or ""), flush=True)
    results["cpu"] = cpu(run, start[0], end, start[1], total)
    if soak_.holder is not None:
        soak_.release_snapshot()
        run.note(total, "snapshot released (the end)")
    drain(run, total)
    results["check"] = check(run, soak_, table)


def cpu(run: Run, a: Reading, b: Reading, done_before: int, total: float) -> dict[str, Any]:
    """CPU per job between the warm-up's end and the end (as benchmarks/measure.py counts it)."""
    jobs = run.done_total - done_before
    figures = measure.cpu_figures(a.sample, b.sample, jobs)
    producer = b.producer - a.producer
    wall = max(b.sample.wall - a.sample.wall, 1e-9)
    figures["others_cores"] = max(0.0, figures["others_cores"] - producer / wall)
    backends = b.backends - a.backends
    figures["pg_backends_cpu_ms_per_job"] = backends * 1000 / jobs if jobs and run.soak.tcp else None
    figures["producer_cpu_ms_per_job"] = producer * 1000 / jobs if jobs else None
    figures["jobs"] = jobs
    figures["from_s"] = run.args.warmup
    figures["to_s"] = total
    pg = figures.get("pg_cpu_ms_per_job")
    print(
        f"cpu per job, {run.args.warmup:g}-{total:g} s ({jobs:,} jobs): "
        f"worker {fmt(figures.get('worker_cpu_ms_per_job'))}; "
        f"PostgreSQL {fmt(figures['pg_backends_cpu_ms_per_job'])} in the worker's backends, "
        f"{fmt(pg)} for the whole server (everyone's: the producer's inserts, autovacuum, this monitor, "
        "other databases); "
        f"producer {fmt(figures['producer_cpu_ms_per_job'])}; others' CPU {figures['others_cores']:.2f} cores",
        flush=True,
    )
    return figures


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} ms"


def drain(run: Run, total: float) -> None:
    """Tick on, nothing enqueued, until every job sent has run or --drain-timeout passes."""
    deadline = time.monotonic() + run.args.drain_timeout
    t = total

    def drained() -> bool:
        return measure.recorded(run.soak.record) >= run.sent_total

    while not drained() and time.monotonic() < deadline:
        start = time.monotonic()
        while not drained() and time.monotonic() < min(deadline, start + run.args.interval):
            time.sleep(0.05)
        t += time.monotonic() - start
        run.tick(t, time.monotonic() - start, "drain")


def check(run: Run, soak_: Soak, table: str) -> dict[str, Any]:
    """Count every job sent: run once, run twice, never run; and the jobs table's rows."""
    time.sleep(0.5)  # a second run of a job would show up here
    runs = measure.read_records(soak_.record, range(run.sent_total))
    queued = run.watch.backlog()
    out: dict[str, Any] = {
        "enqueued": run.sent_total,
        "ran": run.sent_total - runs.missing,
        "duplicates": runs.duplicates,
        "missing": runs.missing,
        "still_queued": queued,
    }
    text = (
        f"check: {run.sent_total:,} enqueued, {out['ran']:,} ran: duplicates {runs.duplicates}, missing {runs.missing}"
    )
    if runs.missing:
        text += f" ({queued:,} still queued after the {run.args.drain_timeout:g} s drain)"
    if soak_.tool == "axa":
        # Outcomes are written just after the jobs end; give the last batch a moment.
        deadline = time.monotonic() + 10
        while True:
            rows, completed, unfinished = run.watch.conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'completed'), "
                "count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'cancelled')) FROM axa_queue"
            ).fetchone()
            # With --retention the oldest rows are gone: wait for none unfinished instead.
            if completed >= out["ran"] or (run.args.retention and not unfinished) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        out["rows"], out["completed"] = rows, completed
        text += f"; {table} holds {rows:,} rows, {completed:,} completed"
        if run.args.retention:
            text += f" (RETENTION {run.args.retention:g} s deletes the older ones)"
    print(text, flush=True)
    return out


def main() -> None:
    args = parse_args()
    tool = args.peer or "axa"
    if os.environ.get("DATABASE_URL"):
        require_local(os.environ["DATABASE_URL"])
    from axa_django.devdb import database

    database(ROOT / "benchmarks" / ".data" / "pg", cleanup="stop")  # without DATABASE_URL: the embedded server
    base_url = os.environ["DATABASE_URL"]
    server = server_info(base_url)
    if server["connection"].startswith("TCP") and server["connection"].split()[1].rsplit(":", 1)[0] not in LOCAL_HOSTS:
        raise SystemExit(f"soak: the server is at {server['connection']}, not on this machine")
    args.pg_pid, args.connection = server["pg_pid"], server["connection"]
    python = sys.executable if tool == "axa" else venvs.ensure(tool, venvs.find_python(args.peer_python))
    name = args.db_prefix + tool
    out = Path(args.json or ROOT / "benchmarks" / "results" / f"soak-{tool}.json")
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "server": server,
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "pg_pid", "connection")},
        "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "load_before": os.getloadavg(),
    }

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="axa-soak-") as tmp:
        url = fresh_database(base_url, name)
        run = Soak(args, tool, python, url, Path(tmp))
        try:
            info = run.setup()
            results["tool"], results["version"] = tool, info["version"]
            results["claim"] = info["claim"][0] if info["claim"] else None
            print_header(args, results, info)
            soak(args, run, info, results)
        except KeyboardInterrupt:
            interrupted = True
            print("soak: interrupted; stopping the worker and the producer, dropping the database", file=sys.stderr)
        finally:
            # A second Ctrl-C must not cut the clean-up short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            run.close()
            with connect(base_url) as conn:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))
            if "intervals" in results:
                results["interrupted"] = interrupted
                results["intervals"] = [i.as_json() for i in results["intervals"]]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(results, indent=2))
                print(f"wrote {out}", flush=True)
    if interrupted:
        raise SystemExit(130)


def print_header(args: argparse.Namespace, results: dict[str, Any], info: dict[str, Any]) -> None:
    s = results["server"]
    total = args.minutes * 60
    held = "no snapshot held"
    if args.hold_snapshot:
        until = f"{args.release_at:g} s" if args.release_at is not None else "the end"
        held = f"a REPEATABLE READ snapshot held from {args.warmup:g} s to {until}"
    print(f"machine: {results['machine']}; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"server: PostgreSQL {s['version']}, {s['connection']}, fsync={s['fsync']}, "
        f"synchronous_commit={s['synchronous_commit']}; server CPU "
        + (f"from /proc (postmaster pid {s['pg_pid']})" if s["pg_pid"] else "not measured (not a local server)")
    )
    command = [Path(info["worker_command"][0]).name, *info["worker_command"][1:]]
    print(f"tool: {info['version']}; worker: {shlex.join(command)}")
    print(
        f"soak: {args.rate:,g} jobs/s in calls of {args.batch} (one every {args.batch / args.rate * 1000:g} ms) "
        f"for {total:g} s, warm-up {args.warmup:g} s, {held}; a line every {args.interval:g} s"
    )
    if info["claim"]:
        print(
            "claim: EXPLAIN (ANALYZE, BUFFERS) of the worker's claim, rolled back "
            f"(plan_cache_mode {PLAN_CACHE_MODE[results['tool']]}); buffers = shared hit + read"
        )
    else:
        print(f"claim: left out ({info['claim_missing']})")
    print(
        "columns: pickup = enqueue call to the job's start (its own record); backlog = queued rows; "
        "cores = the worker process / "
        + ("its PostgreSQL backends" if args.connection.startswith("TCP") else "the whole server (a Unix socket)")
    )
    print(f"command: {results['command']}", flush=True)
    print(HEAD, flush=True)


if __name__ == "__main__":
    main()
