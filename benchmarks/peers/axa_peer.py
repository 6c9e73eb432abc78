"""axa-django in the benchmark: ``runworker`` at its defaults (plus run.py's --axa-args), ``perform_later(_many)``."""

from __future__ import annotations

import os
import shlex
import sys

from benchmarks.peers.base import CHUNK, Tool, groups, spread_names


class Peer(Tool):
    table = "axa_queue"

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

    def fill(self, ids: list[int]) -> None:
        from axa_django.registry import registry

        spread = spread_names()
        for (name, priority), part in groups(ids).items():
            job = registry[f"bench.record{name}"] if spread else self.job
            job = job.using(priority=priority) if priority else job
            for offset in range(0, len(part), CHUNK):
                job.perform_later_many([{"i": i} for i in part[offset : offset + CHUNK]])

    def claim_statement(self, limit: int | None = None) -> tuple[str, list[str]] | None:
        """The plain CLAIM as runworker composes it (names written in), for ``limit`` rows (4, the
        default --concurrency), none ahead."""
        from axa_django import sql
        from axa_django.registry import registry
        from axa_django.selection import task_backend_aliases

        text = sql.compose(sql.CLAIM, sorted(registry), task_backend_aliases(), None)
        for number, name in enumerate(("worker", "limit", "ahead"), 1):
            text = text.replace(f"%({name})s", f"${number}")
        if "%(" in text.replace("%%", ""):
            raise RuntimeError("sql.CLAIM takes parameters other than worker, limit and ahead; update axa_peer")
        return text.replace("%%", "%"), ["NULL", str(limit or 4), "false"]

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "django", "runworker", *shlex.split(os.environ.get("BENCH_AXA_ARGS", ""))]
