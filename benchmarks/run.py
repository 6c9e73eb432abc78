#!/usr/bin/env python
"""Benchmark axa-django, alone or beside its peers, on the PostgreSQL server DATABASE_URL names.

Workloads, the same for every tool at its own defaults: enqueue one at a time, bulk enqueue,
drain of ready no-op jobs by 1 and 2 worker processes, pickup latency of jobs enqueued every
--latency-gap s to one idle worker; with --shapes, more drains of the same --drain jobs: spread over
N task names (``names:N``, each name registered in every tool's worker: axa job names, Graphile
task identifiers, pgqueuer entrypoints), over P priorities (``priorities:P``), or by K worker
processes (``processes:K``), one process each otherwise; and (axa only) claim time on an empty table versus one with
1,000,000 finished rows and 100,000 ready rows of other names. Each tool gets a fresh database
(axa_bench_<tool>) on that server and runs in its own venv (benchmarks/.venvs/<peer>, made here).
Without DATABASE_URL an embedded PostgreSQL is kept under benchmarks/.data (a Unix socket:
flattering; see docs/performance.md for a durable server over TCP).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import measure, venvs  # noqa: E402
from benchmarks.report import report  # noqa: E402

PEERS = ["axa-throughput", "pgqueuer", "procrastinate", "django-tasks-db", "graphile-worker", "graphile-worker-tuned"]
NO_BULK = {"django-tasks-db"}
PHASES = ["single", "bulk", "drain1", "drain2", "latency"]
SHAPES = ("names", "priorities", "processes")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", action="append", default=[], choices=PEERS, help="also run this peer (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, tools interleaved in each (default 1)")
    parser.add_argument("--single", type=int, default=3000, help="jobs enqueued one at a time (default 3000)")
    parser.add_argument("--bulk", type=int, default=100_000, help="jobs enqueued in bulk (default 100000)")
    parser.add_argument("--drain", type=int, default=10_000, help="no-op jobs drained per run (default 10000)")
    parser.add_argument("--latency-jobs", type=int, default=200, help="jobs for the pickup latency run")
    parser.add_argument("--latency-gap", type=float, default=0.02, help="seconds between those jobs")
    parser.add_argument("--finished-rows", type=int, default=1_000_000, help="finished rows for the claim run")
    parser.add_argument("--foreign-rows", type=int, default=100_000, help="ready rows of other names")
    parser.add_argument(
        "--shapes",
        default="",
        help="more drains, comma-separated: names:N, priorities:P, processes:K (e.g. names:100,processes:32)",
    )
    parser.add_argument("--skip", action="append", default=[], choices=[*PHASES, "claim"])
    parser.add_argument("--idle-below", type=float, default=0.3, help="wait for busy cores below this (default 0.3)")
    parser.add_argument(
        "--idle-timeout", type=float, default=20.0, help="but no longer than this, s (default 20; 0: no wait)"
    )
    parser.add_argument(
        "--axa-args", default="", help='extra runworker arguments, e.g. "--concurrency 16" (default: none)'
    )
    parser.add_argument(
        "--throughput-args",
        default="--concurrency 1",
        help="runworker arguments of --peer axa-throughput: axa beside itself at its throughput setting for short "
        'jobs, docs/workers.md (default "--concurrency 1")',
    )
    parser.add_argument("--db-prefix", default="axa_bench_", help="databases are <prefix><tool> (default axa_bench_)")
    parser.add_argument("--peer-python", help="Python >= 3.12 for the peers' venvs (default: found on PATH/pyenv)")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "latest.json"), help="output file")
    args = parser.parse_args()
    for shape in shapes(args):
        kind, _, count = shape.partition(":")
        if kind not in SHAPES or not count.isdigit() or int(count) < 1:
            parser.error(f"--shapes: {shape!r} is not one of names:N, priorities:P, processes:K (N, P, K >= 1)")
    return args


def shapes(args: argparse.Namespace) -> list[str]:
    return [part.strip() for part in args.shapes.split(",") if part.strip()]


def connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def with_database(url: str, name: str) -> str:
    head, _, query = url.partition("?")
    return head.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")


def server_info(url: str) -> dict[str, Any]:
    """Version, durability settings, connection type, and the postmaster's pid when it is on this machine."""
    with connect(url) as conn:
        version, fsync, sync_commit, addr, port, backend = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'), "
            "current_setting('synchronous_commit'), host(inet_server_addr()), inet_server_port(), pg_backend_pid()"
        ).fetchone()
        where = f"TCP {addr}:{port}" if addr else "Unix socket " + (conn.info.host or "")
        pg_pid = 0
        if not addr or addr in ("127.0.0.1", "::1"):
            # The backend's parent is the postmaster; its CPU counts every backend, reaped or
            # live. Read while the connection is open: a closed backend's /proc entry is gone.
            try:
                ppid = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
                if "postgres" in Path(f"/proc/{ppid}/cmdline").read_text():
                    pg_pid = ppid
            except (OSError, ValueError, IndexError):
                pass
    return {
        "version": version,
        "fsync": fsync,
        "synchronous_commit": sync_commit,
        "connection": where,
        "pg_pid": pg_pid,
    }


def base_url() -> str:
    """The server to measure, from DATABASE_URL (a tool's own databases are made on it)."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        raise SystemExit("set DATABASE_URL to the server to measure (durable, over TCP, as docs/performance.md says)")
    return base


def migrated_database(base: str, name: str) -> str:
    """A fresh database ``name`` on ``base``'s server, migrated with the benchmark settings; its URL,
    also set as this process's DATABASE_URL (for the Django the caller sets up next)."""
    url = fresh_database(base, name)
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="benchmarks.settings")
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    os.environ["DATABASE_URL"] = url
    return url


def fresh_database(base: str, name: str) -> str:
    with connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return with_database(base, name)


def clean(url: str, vacuum_only: bool = False) -> None:
    """Empty the tool's tables (not its migration records), then VACUUM ANALYZE and CHECKPOINT."""
    with connect(url) as conn:
        if not vacuum_only:
            tables = conn.execute(
                "SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') FROM pg_tables "
                "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') "
                "AND tablename NOT IN ('django_migrations', 'migrations')"  # Graphile Worker's is 'migrations'
            ).fetchone()[0]
            if tables:
                conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


class Runner:
    """Runs benchmarks/driver.py phases of one tool in its venv, on its database."""

    def __init__(self, tool: str, python: str, url: str, pg_pid: int, axa_args: str) -> None:
        self.tool, self.python, self.url, self.pg_pid = tool, python, url, pg_pid
        self.axa_args = axa_args

    def __call__(self, phase: str, *extra: str, shape: str = "") -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="axa-bench-") as tmp:
            out = Path(tmp) / "out.json"
            command = [self.python, str(ROOT / "benchmarks" / "driver.py"), "--tool", self.tool, "--phase", phase]
            command += ["--pg-pid", str(self.pg_pid), "--out", str(out), *extra]
            env = dict(
                os.environ, DATABASE_URL=self.url, PYTHONPATH=str(ROOT), BENCH_AXA_ARGS=self.axa_args, BENCH_SHAPE=shape
            )
            env.pop("DJANGO_SETTINGS_MODULE", None)
            subprocess.run(command, cwd=ROOT, env=env, check=True)
            return json.loads(out.read_text())


def run_phase(args: argparse.Namespace, runner: Runner, phase: str) -> dict[str, Any]:
    clean(runner.url)
    shape = phase.partition(" ")[2]  # "drain names:100"
    if phase.startswith("drain"):
        runner("fill", "--n", str(args.drain), shape=shape)
        clean(runner.url, vacuum_only=True)
    idle = measure.wait_idle(args.idle_below, args.idle_timeout) if args.idle_timeout else None
    load = os.getloadavg()[0]
    if phase == "single":
        result = runner("single", "--n", str(args.single))
    elif phase == "bulk":
        result = runner("bulk", "--n", str(args.bulk))
    elif shape:
        processes = shape.partition(":")[2] if shape.startswith("processes:") else "1"
        result = runner("drain", "--n", str(args.drain), "--processes", processes, shape=shape)
    elif phase.startswith("drain"):
        result = runner("drain", "--n", str(args.drain), "--processes", phase[-1])
    else:
        result = runner("latency", "--n", str(args.latency_jobs), "--gap", str(args.latency_gap))
    return {**result, "busy_before_cores": idle, "load1_before": load}


def describe(phase: str, tool: str, result: dict[str, Any]) -> str:
    if phase == "latency":
        main = f"p50 {result['p50_ms']:.2f} ms, p95 {result['p95_ms']:.2f}, p99 {result['p99_ms']:.2f}"
        if "max_ms" in result:
            main += f", max {result['max_ms']:.2f}"
    else:
        main = f"{result['per_s']:,.0f} jobs/s"
    extras = [f"{k}={v:.3g}" for k, v in result.items() if isinstance(v, float) and k not in ("per_s",)]
    extras += [f"{k}={v}" for k, v in result.items() if isinstance(v, int) and not isinstance(v, bool)]
    return f"  {phase:<8} {tool:<16} {main}  ({', '.join(extras)})"


def main() -> None:
    args = parse_args()
    from axa_django.devdb import database

    base = database(ROOT / "benchmarks" / ".data" / "pg", cleanup="stop")
    base_url = os.environ["DATABASE_URL"]
    server = server_info(base_url)
    tools = ["axa", *dict.fromkeys(args.peer)]
    peer_python = venvs.find_python(args.peer_python) if args.peer else ""
    runners = {}
    versions = {}
    for tool in tools:
        python = sys.executable if tool.startswith("axa") else venvs.ensure(tool, peer_python)
        url = fresh_database(base_url, args.db_prefix + tool.replace("-", "_"))
        axa_args = args.throughput_args if tool == "axa-throughput" else args.axa_args
        runners[tool] = Runner(tool, python, url, server["pg_pid"], axa_args)
        versions[tool] = runners[tool]("setup")["version"]
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "server": server,
        "user": base["USER"],
        "versions": versions,
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "runs": {tool: {} for tool in tools},
    }
    print_header(results)
    phases = [p for p in PHASES if p not in args.skip] + [f"drain {shape}" for shape in shapes(args)]
    for round_no in range(args.rounds):
        print(f"round {round_no + 1} of {args.rounds}", flush=True)
        for index, phase in enumerate(phases):
            shift = (round_no + index) % len(tools)
            for tool in tools[shift:] + tools[:shift]:  # who goes first rotates
                if phase == "bulk" and tool in NO_BULK:
                    continue
                result = run_phase(args, runners[tool], phase)
                results["runs"][tool].setdefault(phase, []).append(result)
                print(describe(phase, tool, result), flush=True)
    if "claim" not in args.skip:
        from benchmarks.claim import bench_claim

        results["claim"] = bench_claim(runners["axa"].url, args.finished_rows, args.foreign_rows)
    report(results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


def print_header(results: dict[str, Any]) -> None:
    s = results["server"]
    print(f"machine: {results['machine']}; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"server: PostgreSQL {s['version']}, {s['connection']}, fsync={s['fsync']}, "
        f"synchronous_commit={s['synchronous_commit']}; server CPU "
        + (f"from /proc (postmaster pid {s['pg_pid']})" if s["pg_pid"] else "not measured (not a local server)")
    )
    for tool, version in results["versions"].items():
        print(f"  {tool:<16} {version}")
    print(f"command: {results['command']}", flush=True)


if __name__ == "__main__":
    main()
