"""What benchmarks/driver.py needs from each tool: enqueue calls and its worker command."""

from __future__ import annotations

import os
import time

CHUNK = 10_000  # jobs per bulk call, for every tool


def shape() -> tuple[str, int]:
    """The drain's workload shape from BENCH_SHAPE (run.py --shapes): ("names", N) spreads the jobs
    over N task names (each registered in the worker), ("priorities", P) over P priorities; ("", 0)
    or ("processes", K) is one name at one priority."""
    kind, _, count = os.environ.get("BENCH_SHAPE", "").partition(":")
    return kind, int(count or 0)


def spread_names() -> int:
    """How many task names the worker registers and the jobs spread over (0: the one ``record``)."""
    kind, count = shape()
    return count if kind == "names" else 0


def groups(ids: list[int]) -> dict[tuple[int, int], list[int]]:
    """``ids`` by (name index, priority) as the shape spreads them: job i is name i % N, priority i % P."""
    kind, count = shape()
    out: dict[tuple[int, int], list[int]] = {}
    for i in ids:
        key = (i % count, 0) if kind == "names" else (0, i % count) if kind == "priorities" else (0, 0)
        out.setdefault(key, []).append(i)
    return out


class Tool:
    """One queue under test; the database is the one DATABASE_URL names."""

    has_bulk = True
    table = ""  # the table whose rows are the jobs (benchmarks/soak.py watches it)

    def __init__(self) -> None:
        self.url = os.environ["DATABASE_URL"]

    def version(self) -> str:
        raise NotImplementedError

    def setup(self) -> None:
        """Install the tool's schema in the (fresh) database."""
        raise NotImplementedError

    def enqueue(self, i: int) -> None:
        raise NotImplementedError

    def enqueue_many(self, ids: list[int]) -> None:
        raise NotImplementedError

    def worker_command(self) -> list[str]:
        """The tool's worker at its defaults, as a user would start it."""
        raise NotImplementedError

    def claim_statement(self, limit: int | None = None) -> tuple[str, list[str]] | None:
        """The worker's claim of ``limit`` jobs (None: its default) as SQL with $1.. parameters and their
        values as SQL literals, for EXPLAIN; None when the tool's claim is out of reach."""
        return None

    def enqueue_single(self, ids: list[int]) -> None:
        for i in ids:
            self.enqueue(i)

    def enqueue_bulk(self, ids: list[int]) -> None:
        for offset in range(0, len(ids), CHUNK):
            self.enqueue_many(ids[offset : offset + CHUNK])

    def fill(self, ids: list[int]) -> None:
        """Write ready jobs, untimed (setup for the drain)."""
        self.enqueue_bulk(ids)

    # Each paced id's time.time() once its enqueue call returned (committed): a pickup's
    # delay is the enqueue's own (the server's commit) plus what the worker took after it.
    returned: dict[int, float]

    def enqueue_paced(self, ids: list[int], gap: float) -> dict[int, float]:
        """Enqueue one job every ``gap`` s; return each id's time.time() just before its enqueue call."""
        sent: dict[int, float] = {}
        self.returned = {}
        next_at = time.monotonic()
        for i in ids:
            sent[i] = time.time()
            self.enqueue(i)
            self.returned[i] = time.time()
            next_at += gap
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        return sent

    def close(self) -> None:
        pass
