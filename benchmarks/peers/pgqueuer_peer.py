"""pgqueuer in the benchmark: ``pgq run benchmarks.peers.pgqueuer_peer:create`` at its defaults.

The worker factory is an ``@asynccontextmanager`` yielding a ``PgQueuer`` (``pgq run`` refuses a
plain coroutine); enqueue is ``Queries.enqueue``, with lists for bulk (one statement per call).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks.measure import record as write
from benchmarks.peers.base import CHUNK, Tool, groups, spread_names

ENTRYPOINT = "record"


@asynccontextmanager
async def create() -> AsyncIterator[Any]:
    """The worker: one entrypoint that records its job's id."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    conn = await asyncpg.connect(os.environ["DATABASE_URL"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    async def record(job: Job) -> None:
        write(int(job.payload or b"0"))

    pgq.entrypoint(ENTRYPOINT)(record)
    for name in range(spread_names()):  # run.py --shapes names:N
        pgq.entrypoint(f"{ENTRYPOINT}{name}")(record)

    try:
        yield pgq
    finally:
        await conn.close()


class Peer(Tool):
    table = "pgqueuer"

    def __init__(self) -> None:
        super().__init__()
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(asyncpg.connect(self.url))
        self.queries = Queries(AsyncpgDriver(self.conn))
        self.bin = Path(os.path.dirname(os.path.abspath(__import__("sys").executable)))

    def version(self) -> str:
        from importlib.metadata import version

        return f"pgqueuer {version('pgqueuer')}, asyncpg {version('asyncpg')}"

    def setup(self) -> None:
        import subprocess

        subprocess.run([str(self.bin / "pgq"), "--pg-dsn", self.url, "install"], check=True, capture_output=True)

    def enqueue(self, i: int) -> None:
        self.loop.run_until_complete(self.queries.enqueue(ENTRYPOINT, str(i).encode()))

    def enqueue_single(self, ids: list[int]) -> None:
        async def run() -> None:
            for i in ids:
                await self.queries.enqueue(ENTRYPOINT, str(i).encode())

        self.loop.run_until_complete(run())

    def enqueue_many(self, ids: list[int]) -> None:
        self.loop.run_until_complete(
            self.queries.enqueue([ENTRYPOINT] * len(ids), [str(i).encode() for i in ids], [0] * len(ids))
        )

    def fill(self, ids: list[int]) -> None:
        spread = spread_names()
        rows = [
            (f"{ENTRYPOINT}{name}" if spread else ENTRYPOINT, str(i).encode(), priority)
            for (name, priority), part in groups(ids).items()
            for i in part
        ]
        for offset in range(0, len(rows), CHUNK):
            names, payloads, priorities = zip(*rows[offset : offset + CHUNK], strict=True)
            self.loop.run_until_complete(self.queries.enqueue(list(names), list(payloads), list(priorities)))

    def enqueue_paced(self, ids: list[int], gap: float) -> dict[int, float]:
        async def run() -> dict[int, float]:
            sent: dict[int, float] = {}
            self.returned = {}
            next_at = time.monotonic()
            for i in ids:
                sent[i] = time.time()
                await self.queries.enqueue(ENTRYPOINT, str(i).encode())
                self.returned[i] = time.time()
                next_at += gap
                pause = next_at - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
            return sent

        return self.loop.run_until_complete(run())

    def claim_statement(self, limit: int | None = None) -> tuple[str, list[str]] | None:
        """The dequeue query as ``pgq run`` builds it at its defaults (batch 10, no limits, 30 s heartbeat)."""
        import uuid
        from datetime import timedelta

        builder = getattr(self.queries, "qbq", None)
        if builder is None or not hasattr(builder, "build_dequeue_query"):
            return None  # another pgqueuer version: the soak leaves the claim's column out
        query = builder.build_dequeue_query(
            batch_size=limit or 10,
            entrypoints=[ENTRYPOINT],
            concurrency_limits=[0],
            queue_manager_id=uuid.uuid4(),
            global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=30),
        )

        def literal(value: Any) -> str:
            if isinstance(value, int):
                return str(value)
            if isinstance(value, list):
                return "ARRAY[" + ", ".join(f"'{x}'" for x in value) + "]::text[]"
            if isinstance(value, uuid.UUID):
                return f"'{value}'::uuid"
            if isinstance(value, timedelta):
                return f"interval '{value.total_seconds()} seconds'"
            raise TypeError(f"pgqueuer's dequeue takes a {type(value).__name__}; update pgqueuer_peer")

        return query.sql, [literal(value) for value in query.args]

    def worker_command(self) -> list[str]:
        return [str(self.bin / "pgq"), "run", "benchmarks.peers.pgqueuer_peer:create"]

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()
