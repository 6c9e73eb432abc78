"""The benchmark's table: medians over rounds, each peer beside axa with a ratio."""

from __future__ import annotations

import statistics
from typing import Any

# (phase, key, label, unit, higher is better)
ROWS = [
    ("single", "per_s", "enqueue, one at a time", "jobs/s", True),
    ("single", "enqueue_client_cpu_ms_per_job", "  client CPU per enqueue", "ms", False),
    ("single", "enqueue_pg_cpu_ms_per_job", "  PostgreSQL CPU per enqueue", "ms", False),
    ("bulk", "per_s", "enqueue, bulk (10,000 per call)", "jobs/s", True),
    ("drain1", "per_s", "drain, 1 worker process", "jobs/s", True),
    ("drain1", "worker_cpu_ms_per_job", "  worker CPU per job", "ms", False),
    ("drain1", "pg_cpu_ms_per_job", "  PostgreSQL CPU per job", "ms", False),
    ("drain1", "startup_s", "  start-up (spawn to first job)", "s", False),
    ("drain2", "per_s", "drain, 2 worker processes", "jobs/s", True),
    ("drain2", "worker_cpu_ms_per_job", "  worker CPU per job", "ms", False),
    ("drain2", "pg_cpu_ms_per_job", "  PostgreSQL CPU per job", "ms", False),
    ("latency", "p50_ms", "pickup latency p50", "ms", False),
    ("latency", "p95_ms", "pickup latency p95", "ms", False),
    ("latency", "p99_ms", "pickup latency p99", "ms", False),
    ("latency", "max_ms", "pickup latency, slowest of a round", "ms", False),
    ("latency", "max_enqueue_ms", "  of it, its enqueue call (the commit)", "ms", False),
    ("latency", "max_after_enqueue_ms", "  slowest pickup after the enqueue returned", "ms", False),
]
WORKERS = {
    "axa": "runworker (defaults: --concurrency 4, NOTIFY wake-up)",
    "axa-throughput": "runworker at its throughput setting (run.py --throughput-args)",
    "pgqueuer": "pgq run module:factory (defaults: --batch-size 10, LISTEN/NOTIFY)",
    "procrastinate": "procrastinate worker --concurrency=4 (LISTEN/NOTIFY)",
    "django-tasks-db": "manage.py db_worker (defaults: polls, --interval 1; CONN_MAX_AGE=None)",
    "graphile-worker": "run() in one Node.js process (defaults: 1 job at a time, pool 10; deletes finished jobs)",
    "graphile-worker-tuned": "run(), its performance page's preset (24 jobs, local queue 500, batched finishes)",
}


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "jobs/s":
        return f"{value:,.0f}"
    return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"


def shape_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, bool]]:
    """The rows of run.py --shapes' drains, each against the one-process drain of one name."""
    out = []
    for shape in [p.partition(" ")[2] for p in results["runs"]["axa"] if p.startswith("drain ")]:
        phase = f"drain {shape}"
        out += [
            (phase, "per_s", f"drain, {shape}", "jobs/s", True),
            (phase, "pg_cpu_ms_per_job", "  PostgreSQL CPU per job", "ms", False),
            (phase, "worker_cpu_ms_per_job", "  worker CPU per job", "ms", False),
        ]
    return out


def report(results: dict[str, Any]) -> None:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = results["runs"]
    tools = list(runs)
    rounds = results["args"]["rounds"]
    print(f"\nmedians of {rounds} round(s); ratio = axa/peer when higher is better, peer/axa when lower is better:")
    print("a ratio above 1 means axa is ahead in that row")
    axa_args = results["args"].get("axa_args")
    for tool in tools:
        worker = f"runworker {axa_args} (run.py --axa-args)" if tool == "axa" and axa_args else WORKERS[tool]
        if tool == "axa-throughput":
            worker = f"runworker {results['args']['throughput_args']} (run.py --throughput-args)"
        print(f"  {tool:<16} {worker}")
    line = f"{'metric':<36} {'unit':<7} {'axa':>10}"
    for tool in tools[1:]:
        line += f" | {tool:>16} {'ratio':>7}"
    print(line)
    print("-" * len(line))
    for phase, key, label, unit, higher in ROWS + shape_rows(results):
        axa = median(runs["axa"].get(phase, []), key)
        values = [median(runs[tool].get(phase, []), key) for tool in tools[1:]]
        if axa is None and all(v is None for v in values):
            continue
        line = f"{label:<36} {unit:<7} {fmt(axa, unit):>10}"
        for value in values:
            ratio = "" if not (axa and value) else f"{(axa / value if higher else value / axa):.2f}x"
            line += f" | {fmt(value, unit):>16} {ratio:>7}"
        print(line)
    print()
    spread = [row for row in shape_rows(results) if row[1] != "worker_cpu_ms_per_job"]
    if spread:
        print("each tool's shapes against its own drain of one name by one process (drain1):")
        for tool in tools:
            base = {key: median(runs[tool].get("drain1", []), key) for key in ("per_s", "pg_cpu_ms_per_job")}
            cells = []
            for phase, key, _, _, _ in spread:
                value = median(runs[tool].get(phase, []), key)
                if value is not None and base[key]:
                    label = phase.partition(" ")[2] + (" jobs/s" if key == "per_s" else " PG CPU")
                    cells.append(f"{label} {value / base[key]:.2f}x")
            print(f"  {tool:<16} " + ", ".join(cells))
        print()
    for tool in tools:
        dups = sum(r.get("duplicates", 0) for p in runs[tool].values() for r in p)
        missing = sum(r.get("missing", 0) for p in runs[tool].values() for r in p)
        timed = [r for p in runs[tool].values() for r in p]
        others = [r["others_cores"] for r in timed if "others_cores" in r]
        busy = [r["busy_before_cores"] for r in timed if r.get("busy_before_cores") is not None] or [0.0]
        print(
            f"{tool:<16} duplicates {dups}, missing {missing} over {len(timed)} runs; "
            f"machine's busy cores before each run median {statistics.median(busy):.2f} max {max(busy):.2f}"
            + (f"; others' CPU during runs median {statistics.median(others):.2f} cores" if others else "")
        )
    claim = results.get("claim")
    if claim:
        print(
            f"\naxa claim: empty table {claim['claim_empty_ms']:.3f} ms, "
            f"with {results['args']['finished_rows']:,} finished + {results['args']['foreign_rows']:,} "
            f"other-name ready rows {claim['claim_big_ms']:.3f} ms "
            f"(ratio {claim['claim_big_ms'] / claim['claim_empty_ms']:.2f})"
        )
