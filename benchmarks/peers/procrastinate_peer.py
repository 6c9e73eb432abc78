"""procrastinate in the benchmark: ``procrastinate --app=benchmarks.peers.procrastinate_peer.app worker
--concurrency=4`` (LISTEN/NOTIFY, its defaults otherwise); ``defer`` and ``batch_defer``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import procrastinate

from benchmarks.measure import record as write
from benchmarks.peers.base import Tool

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["DATABASE_URL"]))


@app.task(name="record")
async def record(i: int) -> None:
    """Records its id and times."""
    write(i)


class Peer(Tool):
    def __init__(self) -> None:
        super().__init__()
        self.bin = Path(os.path.dirname(os.path.abspath(sys.executable)))
        self.app = app.open()

    def version(self) -> str:
        from importlib.metadata import version

        return f"procrastinate {version('procrastinate')}, psycopg {version('psycopg')}"

    def setup(self) -> None:
        app.schema_manager.apply_schema()

    def enqueue(self, i: int) -> None:
        record.defer(i=i)

    def enqueue_many(self, ids: list[int]) -> None:
        record.batch_defer(*({"i": i} for i in ids))

    def worker_command(self) -> list[str]:
        return [str(self.bin / "procrastinate"), f"--app={__name__}.app", "worker", "--concurrency=4"]

    def close(self) -> None:
        app.close()
