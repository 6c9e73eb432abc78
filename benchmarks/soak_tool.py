"""The tool's side of benchmarks/soak.py, run in the tool's own venv (stdlib and the tool only).

``setup``: install the tool's schema in the database DATABASE_URL names and write, as JSON,
its version, its worker command, its jobs table and its claim statement (for EXPLAIN).
``produce``: enqueue no-op jobs ``--batch`` at a time, one call every batch/rate seconds on a
fixed schedule (a late call is followed at once by the next, so the mean rate holds), until
SIGTERM; each call appends one fixed-width line, ``first-id count time``, to ``--sent``, the
time taken just before the call (as driver.py's pickup latency does).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.driver import MODULES  # noqa: E402
from benchmarks.peers.base import Tool  # noqa: E402

SENT_LINE = 34  # "fffffffff ccccc ttttttttttt.tttttt\n"


def sent_line(first: int, count: int, at: float) -> bytes:
    return f"{first:09d} {count:05d} {at:017.6f}\n".encode()


def setup(tool: Tool, claim_limit: int | None) -> dict[str, Any]:
    tool.setup()
    try:
        claim, missing = tool.claim_statement(claim_limit), "the tool builds no claim statement we can reach"
    except Exception as error:  # noqa: BLE001 (a peer's internals moved: the soak goes on without the column)
        claim, missing = None, f"{type(error).__name__}: {error}"
    return {
        "version": tool.version(),
        "worker_command": tool.worker_command(),
        "table": tool.table,
        "claim": claim,
        "claim_missing": None if claim else missing,
    }


def produce(tool: Tool, rate: float, batch: int, limit: float, sent: Path) -> None:
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent = os.getppid()
    fd = os.open(sent, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    gap = batch / rate
    next_at = time.monotonic()
    deadline = next_at + limit  # a safety net: soak.py stops the producer itself
    first = 0
    while not stopping and time.monotonic() < deadline and os.getppid() == parent:
        at = time.time()
        if batch == 1:
            tool.enqueue(first)
        else:
            tool.enqueue_many(list(range(first, first + batch)))
        os.write(fd, sent_line(first, batch, at))
        first += batch
        next_at += gap
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=["setup", "produce"])
    parser.add_argument("--tool", required=True, choices=sorted(MODULES))
    parser.add_argument("--out", help="setup: the JSON file to write")
    parser.add_argument("--claim-limit", type=int, help="setup: jobs per claim (default: the worker's)")
    parser.add_argument("--rate", type=float, default=1000.0, help="produce: jobs/s")
    parser.add_argument("--batch", type=int, default=10, help="produce: jobs per enqueue call")
    parser.add_argument("--limit", type=float, default=3600.0, help="produce: stop after this many seconds anyway")
    parser.add_argument("--sent", help="produce: the file of enqueue calls")
    args = parser.parse_args()
    tool: Tool = importlib.import_module(MODULES[args.tool]).Peer()
    try:
        if args.role == "setup":
            Path(args.out).write_text(json.dumps(setup(tool, args.claim_limit)))
        else:
            produce(tool, args.rate, args.batch, args.limit, Path(args.sent))
    finally:
        tool.close()


if __name__ == "__main__":
    main()
