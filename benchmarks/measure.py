"""Measuring without dependencies (stdlib only: every peer's venv imports it).

Jobs append one fixed-width line per run to the file BENCH_RECORD names; CPU comes from /proc.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINE = 45  # "iiiiiiii sssssssssss.ssssss eeeeeeeeee.eeeeee\n"
_fds: dict[str, int] = {}
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def record(i: int) -> None:
    """What every benchmark job does: one O_APPEND write of its id, start and end time."""
    start = time.time()
    path = os.environ["BENCH_RECORD"]
    fd = _fds.get(path)
    if fd is None:
        # Opened once per process so the job costs one write; a racing second open is harmless.
        fd = _fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{i:08d} {start:017.6f} {time.time():017.6f}\n".encode())


def recorded(path: Path) -> int:
    """How many job runs the file holds (lines are fixed width, so no read is needed)."""
    try:
        return path.stat().st_size // LINE
    except FileNotFoundError:
        return 0


@dataclass
class Records:
    starts: dict[int, float]
    first_start: float
    last_end: float
    duplicates: int
    missing: int


def read_records(path: Path, expected: Iterable[int]) -> Records:
    """Parse the file: first start of each id, the span, and duplicate and missing runs of ``expected``."""
    counts: Counter[int] = Counter()
    starts: dict[int, float] = {}
    first, last = float("inf"), 0.0
    for line in path.read_text().splitlines():
        i, start, end = line.split()
        key = int(i)
        counts[key] += 1
        starts.setdefault(key, float(start))
        first, last = min(first, float(start)), max(last, float(end))
    wanted = set(expected)
    duplicates = sum(n - 1 for n in counts.values() if n > 1) + sum(n for k, n in counts.items() if k not in wanted)
    return Records(starts, first, last, duplicates, len(wanted - counts.keys()))


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from 3 (state) on; comm may hold spaces


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def tree_cpu(pids: Iterable[int]) -> float:
    """Seconds of user+sys CPU of these processes, their live descendants and their reaped children."""
    tree = _children()
    total, todo, seen = 0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        fields = _stat(pid)
        if fields:
            # utime, stime, cutime, cstime: fields 14-17, here 11-14.
            total += sum(int(v) for v in fields[11:15])
            todo.extend(tree.get(pid, []))
    return total / TICK


def process_cpu(pid: int) -> float | None:
    """Seconds of user+sys CPU of one process (not its children), or None once it is gone."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else None


def local_ports(pids: Iterable[int]) -> set[int]:
    """Local TCP ports of these processes' and their descendants' sockets (their backends' client_port)."""
    tree = _children()
    inodes: set[str] = set()
    todo, seen = list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(tree.get(pid, []))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... uid timeout inode
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def machine_busy() -> float:
    """Seconds of non-idle CPU of the whole machine since boot (all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICK


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


class Sample:
    """CPU counters at one moment: the given worker processes, the PostgreSQL server, this process, the machine."""

    def __init__(self, workers: Iterable[int], pg_pid: int | None) -> None:
        self.workers = tree_cpu(workers)
        self.pg = tree_cpu([pg_pid]) if pg_pid else 0.0
        self.own = self_cpu()
        self.machine = machine_busy()
        self.wall = time.monotonic()


def cpu_figures(a: Sample, b: Sample, jobs: int, prefix: str = "") -> dict[str, Any]:
    """Per-job CPU between two samples, and the machine's CPU that was none of ours (cores busy)."""
    worker, pg, own = b.workers - a.workers, b.pg - a.pg, b.own - a.own
    others = (b.machine - a.machine) - worker - pg - own
    span = max(b.wall - a.wall, 1e-9)
    out: dict[str, Any] = {"others_cores": max(others, 0.0) / span}
    if jobs:
        out[prefix + "pg_cpu_ms_per_job"] = pg * 1000 / jobs if a.pg or b.pg else None
        if prefix:
            out[prefix + "client_cpu_ms_per_job"] = own * 1000 / jobs
        else:
            out["worker_cpu_ms_per_job"] = worker * 1000 / jobs
    return out


def wait_until(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.01) -> None:
    """Poll ``condition`` until true; exit the benchmark after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


def wait_idle(limit: float, timeout: float = 30.0) -> float:
    """Wait up to ``timeout`` s for a second with fewer busy cores than ``limit``; return the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        before, start = machine_busy(), time.monotonic()
        time.sleep(1.0)
        busy = (machine_busy() - before) / (time.monotonic() - start)
        if busy < limit or time.monotonic() > deadline:
            return busy
