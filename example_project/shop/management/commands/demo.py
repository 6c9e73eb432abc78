"""python manage.py demo: the example end to end in one command.

Migrates, enqueues a sample of jobs, then either runs a worker and the development
server until Ctrl-C, or (``--burst``) runs the worker until the queue is drained and
prints a summary.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.db.models import Count, Sum

from axa_django import Job
from example_project.shop.samples import KINDS


def _number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            limits = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {limits}, got {value}")
        return value

    return parse


class Command(BaseCommand):
    help = (
        "Run the example: migrate, create an admin user, enqueue sample jobs, then run a worker and the "
        "development server until Ctrl-C. With --burst: run the worker until the queue is drained, print a "
        "summary and exit."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--jobs", type=_number(0), default=200, help="sample jobs to enqueue (default 200)")
        parser.add_argument(
            "--burst", action="store_true", help="no web server: run the worker until drained, print a summary"
        )
        parser.add_argument("--port", type=_number(1, 65535), default=8000, help="web server port (default 8000)")
        parser.add_argument("--concurrency", type=_number(1), default=4, help="worker threads (default 4)")
        parser.add_argument("--username", default="admin", help="admin user to create or reset (default admin)")
        parser.add_argument("--password", default=None, help="its password (default: a new random one)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = options["verbosity"]
        database = connections["default"].settings_dict
        self.say(f"database {database['NAME']} on {database['HOST'] or 'localhost'}; migrating")
        call_command("migrate", interactive=False, verbosity=max(0, self.verbosity - 1))
        ids = self.enqueue_sample(options["jobs"])
        worker = ["runworker", "--concurrency", str(options["concurrency"])]
        if options["burst"]:
            self.burst(worker, ids, options["concurrency"])
        else:
            username, password, created = self.reset_admin(options["username"], options["password"])
            self.stdout.write(
                f"demo: admin user {username!r} ({'created' if created else 'reset'}), password {password!r}"
            )
            self.serve(worker, options["port"])

    def say(self, text: str) -> None:
        if self.verbosity > 0:
            self.stdout.write(f"demo: {text}")

    # -- steps -------------------------------------------------------------------

    def enqueue_sample(self, count: int) -> list[Any]:
        """Enqueue ``count`` jobs, alternating the shop's two kinds; return their ids."""
        rng = random.Random()
        ids: list[Any] = []
        kinds = list(KINDS.values())
        for index, (job, make_args, _) in enumerate(kinds):
            calls = [make_args(rng) for _ in range(index, count, len(kinds))]
            ids.extend(row.id for row in job.perform_later_many(calls))
        self.say(f"enqueued {len(ids)} sample jobs ({', '.join(job.__name__ for job, _, _ in kinds)})")
        return ids

    def reset_admin(self, username: str, password: str | None) -> tuple[str, str, bool]:
        password = password or secrets.token_urlsafe(9)
        user_model = get_user_model()
        user, created = user_model._default_manager.get_or_create(
            **{user_model.USERNAME_FIELD: username}, defaults={"email": f"{username}@example.com"}
        )
        user.is_active = user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        return username, password, created

    def burst(self, worker: list[str], ids: list[Any], concurrency: int) -> None:
        """Run one worker until the queue is drained; print what became of the sample."""
        self.say("running the worker until the queue is drained")
        show_worker = self.verbosity > 1
        started = time.monotonic()
        proc = subprocess.run(
            self.command(*worker, "--burst"),
            env=self.child_env(),
            stdout=None if show_worker else subprocess.PIPE,
            stderr=None if show_worker else subprocess.STDOUT,
            text=True,
            check=False,
        )
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            if proc.stdout:
                self.stderr.write(proc.stdout, ending="")
            raise CommandError(f"the worker exited with status {proc.returncode}", returncode=proc.returncode or 1)
        sample = Job.objects.filter(id__in=ids)
        counts = dict(sample.order_by().values_list("status").annotate(n=Count("id")))
        attempts = sample.aggregate(n=Sum("attempts"))["n"] or 0
        completed = counts.pop(Job.Status.COMPLETED, 0)
        failed = counts.pop(Job.Status.FAILED, 0)
        left = sum(counts.values())
        summary = f"demo: {len(ids)} jobs, {completed} completed, {failed} failed"
        if left:
            summary += f", {left} not finished"
        summary += f" in {elapsed:.1f}s ({concurrency} threads, {max(0, attempts - len(ids))} retries)"
        self.stdout.write(summary)

    def serve(self, worker: list[str], port: int) -> None:
        """Run the worker and the development server until Ctrl-C or SIGTERM, then stop both."""
        url = f"http://127.0.0.1:{port}/"
        self.stdout.write(f"demo: open {url} (the admin is at {url}admin/); Ctrl-C stops")
        connections.close_all()

        signals = 0
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            nonlocal signals
            signals += 1
            stop.set()

        previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        procs: list[subprocess.Popen[bytes]] = []
        try:
            # Each child gets its own process group, so a Ctrl-C in the terminal reaches
            # only this command, which then stops them in order, each signalled once.
            workerproc = self.start(*worker)
            procs.append(workerproc)
            server = self.start("runserver", "--noreload", f"127.0.0.1:{port}")
            procs.append(server)
            while not stop.is_set() and workerproc.poll() is None and server.poll() is None:
                stop.wait(0.2)
            crashed = None
            if not stop.is_set():
                crashed = "development server" if server.poll() is not None else "worker"

            if server.poll() is None:
                server.terminate()
            if workerproc.poll() is None:
                self.stdout.write("demo: stopping; the worker finishes the jobs it is running (Ctrl-C again: stop now)")
                workerproc.send_signal(signal.SIGTERM)
            seen = signals
            while workerproc.poll() is None:
                if signals > seen:
                    # Asked again: the worker's second signal gives running jobs back to the queue.
                    workerproc.send_signal(signal.SIGTERM)
                    seen = signals
                stop.clear()
                stop.wait(0.1)
            server.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if crashed:
            hint = f" (is port {port} in use? try --port)" if crashed == "development server" else ""
            raise CommandError(f"the {crashed} stopped by itself{hint}")
        if workerproc.returncode:
            raise CommandError("the worker was stopped before its jobs finished; they are queued again")
        self.say("stopped")

    # -- child processes ---------------------------------------------------------

    def command(self, *args: str) -> list[str]:
        return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args]

    def child_env(self) -> dict[str, str]:
        # DATABASE_URL is in os.environ (set by devdb when it started the embedded
        # server), so the children use this database and do not start another.
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.stdout.flush()
        return subprocess.Popen(self.command(*args), env=self.child_env(), process_group=0)
