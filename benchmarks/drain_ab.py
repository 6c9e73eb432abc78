#!/usr/bin/env python
"""A/B drain: one worker of each of two checkouts drains the same jobs, round after round, in turn.

    DATABASE_URL=postgresql://postgres:postgres@127.0.0.1:5432/postgres \\
        python benchmarks/drain_ab.py --old ../axa-old --new . [--rounds 8] [--jobs 60000] [--out FILE.json]
    python benchmarks/drain_ab.py --pool A.json B.json     # paired statistics of earlier runs, together

What a change costs a draining worker, measured on each side's own code. Each round runs OLD
then NEW (NEW then OLD with --new-first); for each side: a fresh database (<--db-prefix>old or
new), migrated and filled with --jobs ``benchmarks.benchapp.jobs.record`` jobs by that
checkout's code (``perform_later_many``, 10,000 a call, run with this Python and the checkout
first on its path), VACUUM ANALYZE and CHECKPOINT, a wait for a quiet machine, then one
``python manage.py runworker --burst --concurrency 1`` (or ``--worker-args``) in the checkout. A checkout needs
manage.py, benchmarks/settings.py, benchmarks/measure.py and that job (15e87c7 has them).

Each line is one drain: jobs/s from the jobs' own records (first start to last end); CPU
per job from /proc over the steady part (the first record to the last) and, as "total",
over the worker's whole life (start-up and exit too): the worker process, its own
PostgreSQL backends (their pids from pg_stat_activity, each read from /proc/PID/stat while
it lives) and the whole server (the postmaster's tree: autovacuum, checkpoints, anyone
else's work); the start-up (spawn to the first job's start), jobs run twice or never, the
worker's exit code, and the file the side's ``axa_django`` was imported from. The server
must run on this machine. After the rounds: medians (min..max) per side, then the rounds
as pairs: the median of NEW/OLD, a bootstrap 95% interval of it, how many rounds NEW was
higher, and a sign-flip test's p. Alternate --new-first runs and pool them (--pool): the
order within a round shows in these figures. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import measure  # noqa: E402
from benchmarks.run import base_url, connect, fresh_database, server_info  # noqa: E402

# Run by the checkout's side (cwd and PYTHONPATH = the checkout): migrate, enqueue, say where axa_django came from.
SIDE = """
import json, sys, time
import django
django.setup()
import axa_django
from django.core.management import call_command
from benchmarks.benchapp.jobs import record
jobs = int(sys.argv[1])
start = time.time()
call_command("migrate", verbosity=0)
migrated = time.time()
for offset in range(0, jobs, 10_000):
    record.perform_later_many([{"i": i} for i in range(offset, min(jobs, offset + 10_000))])
print(json.dumps({"axa_file": axa_django.__file__, "migrate_s": migrated - start, "enqueue_s": time.time() - migrated}))
"""
SIDES = ("OLD", "NEW")
NEEDS = ("manage.py", "benchmarks/settings.py", "benchmarks/measure.py", "benchmarks/benchapp/jobs.py")
MEDIANS = ["jobs_per_s", "worker_ms_job", "pg_own_ms_job", "pg_server_ms_job"]
MEDIANS += ["worker_total_ms_job", "pg_own_total_ms_job", "pg_server_total_ms_job", "startup_s"]
PAIRED = [key for key in MEDIANS if key != "pg_server_total_ms_job"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, help="the checkout before the change")
    parser.add_argument("--new", type=Path, help="the checkout with it")
    parser.add_argument("--rounds", type=int, default=8, help="rounds, each side once in each (default 8)")
    parser.add_argument("--jobs", type=int, default=60_000, help="jobs per drain (default 60000)")
    parser.add_argument("--worker-args", default="--concurrency 1", help="runworker's arguments but --burst")
    parser.add_argument("--new-first", action="store_true", help="NEW before OLD in each round")
    parser.add_argument("--db-prefix", default="axa_bench_ab_", help="databases <prefix>old, <prefix>new")
    parser.add_argument("--out", type=Path, help="write the rounds here as JSON (after each drain)")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="FILE.json", help="only the paired statistics")
    args = parser.parse_args(argv)
    if not args.pool and not (args.old and args.new):
        parser.error("give --old PATH and --new PATH (two checkouts), or --pool FILE.json ...")
    for path in (args.old, args.new) if not args.pool else ():
        missing = [f for f in NEEDS if not (path / f).is_file()]
        if missing:
            parser.error(f"{path} is not a checkout this driver can run: no {', '.join(missing)}")
    return args


def head(path: Path) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%h %s"], cwd=path, capture_output=True, text=True)
    return out.stdout.strip()[:100] or "(not a git checkout)"


class Backends(threading.Thread):
    """The CPU seconds of each PostgreSQL backend serving the database, but the monitor's own, while it lives."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.seen: dict[int, float] = {}

    def run(self) -> None:
        with connect(self.url) as conn:
            listed = 0.0
            while not self.stop.is_set():
                if time.monotonic() - listed > 0.1:
                    for (pid,) in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    ).fetchall():
                        self.seen.setdefault(pid, 0.0)
                    listed = time.monotonic()
                for pid in list(self.seen):
                    cpu = measure.process_cpu(pid)
                    if cpu is not None:
                        self.seen[pid] = cpu
                time.sleep(0.02)

    def total(self) -> float:
        return sum(self.seen.values())


def exited(pid: int) -> bool:
    """Whether the child has ended, leaving it unreaped: os.wait4 then reads its resource use."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def drain(side: str, path: Path, round_: int, args: argparse.Namespace, base: str, pg_pid: int) -> dict[str, Any]:
    """One side's drain of a fresh database: the figures of one line."""
    jobs, load = args.jobs, Path("/proc/loadavg").read_text().strip()
    url = fresh_database(base, args.db_prefix + side.lower())
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(path), DJANGO_SETTINGS_MODULE="benchmarks.settings")
    made = subprocess.run(
        [sys.executable, "-c", SIDE, str(jobs)], cwd=path, env=env, capture_output=True, text=True, check=False
    )
    if made.returncode:
        raise SystemExit(f"{side} ({path}): migrate and enqueue failed:\n{made.stderr[-3000:]}")
    setup = json.loads(made.stdout.strip().splitlines()[-1])
    if not setup["axa_file"].startswith(f"{path}/"):
        raise SystemExit(f"{side}: axa_django came from {setup['axa_file']}, not from {path}")
    with connect(url) as conn:
        queued = conn.execute("SELECT count(*) FROM axa_queue WHERE status = 'queued'").fetchone()[0]
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    if queued != jobs:
        raise SystemExit(f"{side}: {queued} jobs queued, not {jobs}")
    busy = measure.wait_idle(0.3, 10)
    with tempfile.TemporaryDirectory(prefix="axa-drain-ab-") as tmp:
        record, log = Path(tmp) / "record", Path(tmp) / "worker.log"
        backends = Backends(url)
        pg0, machine0, wall0 = measure.tree_cpu([pg_pid]), measure.machine_busy(), time.monotonic()
        spawned = time.time()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "runworker", "--burst", *shlex.split(args.worker_args)],
                cwd=path,
                env=dict(env, BENCH_RECORD=str(record)),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        backends.start()
        status = None
        try:
            measure.wait_until(lambda: measure.recorded(record) > 0 or exited(proc.pid), 120, "the first job")
            w_b, pg_b, own_b, done_b = (
                measure.tree_cpu([proc.pid]),
                measure.tree_cpu([pg_pid]),
                backends.total(),
                measure.recorded(record),
            )
            measure.wait_until(lambda: measure.recorded(record) >= jobs or exited(proc.pid), 1800, "every job", 0.02)
            w_a, pg_a, own_a = measure.tree_cpu([proc.pid]), measure.tree_cpu([pg_pid]), backends.total()
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if status is None:  # interrupted: no worker left draining a database about to be dropped
                proc.kill()
                proc.wait()
        proc.returncode = os.waitstatus_to_exitcode(status)
        time.sleep(0.1)  # the backends' last CPU, read once more before the thread stops
        backends.stop.set()
        backends.join()
        pg1, machine1, wall1 = measure.tree_cpu([pg_pid]), measure.machine_busy(), time.monotonic()
        runs = measure.read_records(record, range(jobs)) if record.exists() else None
        if proc.returncode or runs is None or runs.missing:
            raise SystemExit(
                f"{side}: the worker exited {proc.returncode}, {runs.missing if runs else jobs} jobs not run:\n"
                + log.read_text(errors="replace")[-3000:]
            )
    span, steady, worker = runs.last_end - runs.first_start, jobs - done_b, usage.ru_utime + usage.ru_stime
    return {
        "side": side,
        "round": round_,
        "loadavg_before": load,
        "busy_cores_before": round(busy, 3),
        "queued": queued,
        "migrate_s": round(setup["migrate_s"], 2),
        "enqueue_s": round(setup["enqueue_s"], 2),
        "rc": proc.returncode,
        "jobs_per_s": jobs / span,
        "span_s": span,
        "startup_s": runs.first_start - spawned,
        "duplicates": runs.duplicates,
        "missing": runs.missing,
        "worker_ms_job": (w_a - w_b) * 1000 / steady,
        "pg_own_ms_job": (own_a - own_b) * 1000 / steady,
        "pg_server_ms_job": (pg_a - pg_b) * 1000 / steady,
        "worker_total_ms_job": worker * 1000 / jobs,
        "pg_own_total_ms_job": backends.total() * 1000 / jobs,
        "pg_server_total_ms_job": (pg1 - pg0) * 1000 / jobs,
        "backends_seen": len(backends.seen),
        "others_cores": max(0.0, (machine1 - machine0) - worker - (pg1 - pg0)) / (wall1 - wall0),
        "axa_file": setup["axa_file"],
    }


def line(r: dict[str, Any]) -> str:
    return (
        f"round {r['round']} {r['side']}: {r['jobs_per_s']:8.1f} jobs/s span {r['span_s']:.2f}s "
        f"| worker {r['worker_ms_job']:.4f} ms/job (total {r['worker_total_ms_job']:.4f}) "
        f"| PG own backends {r['pg_own_ms_job']:.4f} ms/job (total {r['pg_own_total_ms_job']:.4f}) "
        f"| PG server {r['pg_server_ms_job']:.4f} (total {r['pg_server_total_ms_job']:.4f}) "
        f"| dup {r['duplicates']} miss {r['missing']} rc {r['rc']} | backends {r['backends_seen']} "
        f"| others {r['others_cores']:.2f} cores | loadavg before: {r['loadavg_before']} busy {r['busy_cores_before']}"
        f" | {r['axa_file']}"
    )


def medians(results: list[dict[str, Any]]) -> None:
    print("\n# medians (min..max) over rounds")
    for key in MEDIANS:
        old, new = ([r[key] for r in results if r["side"] == side] for side in SIDES)
        o, n = (statistics.median(old), min(old), max(old)), (statistics.median(new), min(new), max(new))
        print(
            f"{key:24s} OLD {o[0]:10.4f} ({o[1]:.4f}..{o[2]:.4f})   NEW {n[0]:10.4f} ({n[1]:.4f}..{n[2]:.4f})   "
            f"NEW/OLD {n[0] / o[0]:.3f}"
        )


def _sign_flip_p(diffs: list[float], draws: int = 20_000, seed: int = 1) -> float:
    """How often random signs give a mean as far from 0 as the rounds' (no difference: about 1)."""
    rnd, observed = random.Random(seed), abs(statistics.mean(diffs))
    hits = sum(
        abs(statistics.mean([d if rnd.random() < 0.5 else -d for d in diffs])) >= observed - 1e-15 for _ in range(draws)
    )
    return hits / draws


def _bootstrap(values: list[float], draws: int = 20_000, seed: int = 2) -> tuple[float, float]:
    rnd = random.Random(seed)
    picks = sorted(statistics.median(rnd.choices(values, k=len(values))) for _ in range(draws))
    return picks[int(0.025 * draws)], picks[int(0.975 * draws)]


def paired(results: list[dict[str, Any]], label: str) -> None:
    """The rounds as (OLD, NEW) pairs: each figure's NEW/OLD ratio, on a log scale."""
    rounds: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for r in results:
        rounds.setdefault((r.get("run", 0), r["round"]), {})[r["side"]] = r
    pairs = [(by["OLD"], by["NEW"]) for by in rounds.values() if set(SIDES) <= set(by)]
    print(f"== {label} ({len(pairs)} pairs)")
    for key in PAIRED:
        old, new = [o[key] for o, _ in pairs], [n[key] for _, n in pairs]
        logs = [math.log(n / o) for o, n in zip(old, new, strict=True)]
        low, high = _bootstrap(logs)
        print(
            f"{key:22s} OLD med {statistics.median(old):9.4f} [{min(old):.4f}..{max(old):.4f}]  "
            f"NEW med {statistics.median(new):9.4f} [{min(new):.4f}..{max(new):.4f}]  "
            f"paired NEW/OLD median {math.exp(statistics.median(logs)):.3f} "
            f"(95% boot CI {math.exp(low):.3f}..{math.exp(high):.3f}), "
            f"NEW>OLD in {sum(x > 0 for x in logs)}/{len(logs)}, sign-flip p={_sign_flip_p(logs):.2f}"
        )


def stamp() -> str:
    return f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}; loadavg {Path('/proc/loadavg').read_text().strip()}"


def main() -> None:
    args = parse_args()
    if args.pool:
        pooled = []
        for run, path in enumerate(args.pool):
            pooled += [dict(r, run=run) for r in json.loads(path.read_text())]
        paired(pooled, "pooled: " + ", ".join(p.name for p in args.pool))
        return
    base = base_url()
    sides = [("OLD", args.old.resolve()), ("NEW", args.new.resolve())]
    if args.new_first:
        sides.reverse()
    info = server_info(base)
    if not info["pg_pid"]:
        raise SystemExit("the server must run on this machine: its CPU and its backends' come from /proc")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"# started {stamp()}")
    print(
        f"# server: PostgreSQL {info['version']}, {info['connection']}, fsync={info['fsync']} "
        f"synchronous_commit={info['synchronous_commit']}, postmaster pid={info['pg_pid']}"
    )
    print(f"# machine: {os.cpu_count()} cores; python {sys.version.split()[0]} ({sys.executable})")
    for side, path in sides:
        print(f"# {side} = {path}: {head(path)}")
    print(
        f"# rounds={args.rounds} jobs={args.jobs}; order per round: {', '.join(side for side, _ in sides)}", flush=True
    )
    results: list[dict[str, Any]] = []
    try:
        for round_ in range(1, args.rounds + 1):
            for side, path in sides:
                results.append(drain(side, path, round_, args, base, info["pg_pid"]))
                print(line(results[-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(results, indent=1))
    finally:
        with connect(base) as conn:
            for side in SIDES:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.db_prefix + side.lower()}" WITH (FORCE)')
    medians(results)
    print()
    paired(results, f"this run, {' then '.join(side for side, _ in sides)} in each round")
    print(f"# finished {stamp()}")


if __name__ == "__main__":
    main()
