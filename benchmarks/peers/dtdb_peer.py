"""django-tasks-db in the benchmark: ``db_worker`` at its defaults, ``task.enqueue``; no bulk API.

Persistent connections (CONN_MAX_AGE=None, as benchmarks/settings.py gives axa): with Django's
default of 0 the peer reconnects per poll and is much slower over TCP with a password.
"""

from __future__ import annotations

import os
import sys
import uuid

from benchmarks.peers.base import Tool


class Peer(Tool):
    has_bulk = False

    def __init__(self) -> None:
        super().__init__()
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.peer_settings"
        import django

        django.setup()
        from benchmarks.peerapp.tasks import record

        self.task = record

    def version(self) -> str:
        import django
        import django_tasks_db

        return f"django-tasks-db {django_tasks_db.__version__}, Django {django.get_version()}"

    def setup(self) -> None:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def enqueue(self, i: int) -> None:
        self.task.enqueue(i)

    def fill(self, ids: list[int]) -> None:
        """bulk_create the rows ``enqueue`` would write (setup only: the peer has no bulk enqueue)."""
        from django_tasks_db.models import DBTaskResult, get_date_max

        task = self.task
        rows = [
            DBTaskResult(
                id=uuid.uuid4(),
                args_kwargs={"args": [i], "kwargs": {}},
                priority=task.priority,
                task_path=task.module_path,
                queue_name=task.queue_name,
                run_after=get_date_max(),
                backend_name="default",
            )
            for i in ids
        ]
        DBTaskResult.objects.bulk_create(rows, batch_size=5000)

    def worker_command(self) -> list[str]:
        return [sys.executable, "-m", "django", "db_worker", "--verbosity", "0"]
