"""axa-django in the benchmark: ``runworker`` at its defaults (plus run.py's --axa-args), ``perform_later(_many)``."""

from __future__ import annotations

import os
import shlex
import sys

from benchmarks.peers.base import Tool


class Peer(Tool):
    def __init__(self) -> None:
        super().__init__()
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
        import django

        django.setup()
        from benchmarks.benchapp.jobs import record

        self.job = record

    def version(self) -> str:
        import subprocess

        import django

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()
        return f"axa-django {rev or '?'}, Django {django.get_version()}"

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def enqueue(self, i: int) -> None:
        self.job.perform_later(i)

    def enqueue_many(self, ids: list[int]) -> None:
        self.job.perform_later_many([{"i": i} for i in ids])

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "django", "runworker", *shlex.split(os.environ.get("BENCH_AXA_ARGS", ""))]
