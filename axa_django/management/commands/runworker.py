"""python manage.py runworker: run background jobs until stopped."""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import sys
import threading
from concurrent.futures import process as futures_process
from concurrent.futures import thread as futures_thread
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from axa_django import conf
from axa_django.management.argtypes import seconds, whole
from axa_django.ops.budget import start_line
from axa_django.ops.health import check_health_file
from axa_django.selection import UnknownQueues, check_known_queues, check_queue
from axa_django.worker import (
    CannotConnect,
    NotMigrated,
    PoolerMisconfigured,
    UnknownJobs,
    Worker,
    reloading,
    task_backend_aliases,
)
from axa_django.worker.logs import configure_for_command
from axa_django.worker.pools import Pools, split


def _positive_int(text: str) -> int:
    return whole(text, 1)


def _count(text: str) -> int:
    return whole(text, 0)


def _seconds(text: str) -> float:
    return seconds(text)


def _grace(text: str) -> float:
    return seconds(text, allow_zero=True)


def _health_file(text: str) -> str:
    try:
        return check_health_file(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _queue(text: str) -> tuple[str, int | None]:
    try:
        queue, size = split(text)
        return check_queue(queue), size
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class Command(BaseCommand):
    help = "Run background jobs from the axa_queue table until SIGTERM/SIGINT (or drained, with --burst)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--concurrency", type=_positive_int, default=4, help="job threads (default 4)")
        parser.add_argument(
            "--prefetch",
            type=_count,
            default=None,
            help="most rows claimed ahead of free threads, for short jobs (default 2048; 0: none)",
        )
        parser.add_argument("--poll-interval", type=_seconds, default=None, help="seconds between polls when idle")
        parser.add_argument(
            "--burst",
            action="store_true",
            help="run every ready job it can, then exit 0 (naming any ready jobs it could not run)",
        )
        parser.add_argument("--max-jobs", type=_positive_int, default=None, help="exit after this many attempts")
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            type=_queue,
            help="claim only from this queue (repeatable); QUEUE:N gives the queue a pool of N threads of its own. "
            "A queue no job declares and no queued job is in is refused (exit 2) as a likely typo",
        )
        parser.add_argument(
            "--new-queue",
            action="append",
            dest="new_queues",
            type=_queue,
            help="as --queue, for a queue nothing knows yet (no job declares it, no job is queued in it): not checked",
        )
        parser.add_argument("--job", action="append", dest="names", help="claim only this job name (repeatable)")
        parser.add_argument(
            "--grace-period",
            type=_grace,
            default=None,
            help="seconds jobs may finish after SIGTERM (default: no limit)",
        )
        parser.add_argument(
            "--timeout-grace",
            type=_grace,
            default=5.0,
            help="seconds a job past its timeout may take to stop before its thread is replaced (default 5)",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="development: restart the worker when its code changes, as runserver does (running jobs get "
            f"--grace-period, default {reloading.RELOAD_GRACE:g}s, then go back to the queue); not with --burst",
        )
        parser.add_argument(
            "--health-file",
            type=_health_file,
            default=None,
            help="touch this file at start and at each heartbeat (for exec probes that cannot reach the database)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_for_command(options["verbosity"])
        reload = options["reload"]
        if reload and options["burst"]:
            raise CommandError(
                "--reload restarts a worker that runs until stopped, and --burst stops once no job is ready: "
                "give one of them",
                returncode=2,
            )
        checked = options["queues"] or []
        queues = checked + (options["new_queues"] or [])
        grace = options["grace_period"]
        common = {
            "poll_interval": options["poll_interval"],
            "burst": options["burst"],
            "names": options["names"],
            "grace_period": reloading.RELOAD_GRACE if reload and grace is None else grace,
            "log_attempts": options["verbosity"] >= 2,
            "timeout_grace": options["timeout_grace"],
            "prefetch": options["prefetch"],
            "health_file": options["health_file"],
        }
        try:
            if any(size is not None for _, size in queues):
                worker: Worker | Pools = Pools(self._pool_sizes(queues, options), **common)
            else:
                worker = Worker(
                    concurrency=options["concurrency"],
                    max_jobs=options["max_jobs"],
                    queues=[queue for queue, _ in queues] or None,
                    **common,
                )
        except UnknownJobs as error:
            raise CommandError(str(error), returncode=2) from None
        except ValueError as error:
            raise CommandError(str(error)) from None
        self._check_queues([queue for queue, _ in checked], [queue for queue, _ in options["new_queues"] or []])
        if reload and not reloading.in_child():
            # This process only watches over the one that runs the worker, and restarts it.
            code = reloading.supervise()
            if code:
                sys.exit(code)
            return
        # Per-queue pools are workers of their own: each says what it holds and beats the file.
        for member in worker.workers if isinstance(worker, Pools) else [worker]:
            logging.getLogger("axa_django").info(start_line(member.concurrency, member.notify))
        # What Django and the job modules loaded lives as long as the process: frozen out of
        # the collector, a full collection no longer walks it (50-90 ms with the GIL held, every
        # thread stalled: a pickup of 30-98 ms), only what the jobs made since.
        gc.collect()
        gc.freeze()
        try:
            code = reloading.serve(worker) if reload else worker.run()
        except (CannotConnect, NotMigrated, PoolerMisconfigured) as error:
            raise CommandError(str(error), returncode=2) from None
        members = worker.workers if isinstance(worker, Pools) else [worker]
        if any(member.ledger.stuck_threads() for member in members) and _joined_at_exit():
            # A job thread given up at its timeout may wait on a thread that Python joins at its
            # exit: an async job's event loop, which asgiref runs on a concurrent.futures thread
            # (every one is joined at exit, daemon or not). Blocked, the worker stopped and never
            # exited, even at the stuck limit (review). The exit's own handlers still run first
            # (logging's, an error reporter's flush); only the join of threads is skipped.
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            sys.exit(code)

    @staticmethod
    def _check_queues(wanted: list[str], new: list[str]) -> None:
        """Exit 2 on a --queue nothing knows: a typo would leave the worker idle without a word."""
        if not wanted:
            return
        alias = conf.get("DATABASE")
        # django.tasks' own default: a backend without QUEUES takes the "default" queue.
        tasks = getattr(settings, "TASKS", {})
        declared = [queue for name in task_backend_aliases() for queue in tasks[name].get("QUEUES", ["default"])]
        try:
            check_known_queues(wanted, new=new, declared=declared, using=alias)
        except UnknownQueues as error:
            raise CommandError(str(error), returncode=2) from None
        except DatabaseError as error:
            # The worker's own start-up waits for the database or says what is wrong with it.
            logging.getLogger("axa_django").warning(
                "could not check --queue %s against the database's queues (%s)", ", ".join(wanted), error
            )
        finally:
            connections[alias].close()  # the worker uses connections of its own

    @staticmethod
    def _pool_sizes(queues: list[tuple[str, int | None]], options: dict[str, Any]) -> dict[str, int]:
        if options["max_jobs"] is not None:
            raise CommandError(
                "--max-jobs counts one pool's attempts; it cannot be used with per-queue pools (QUEUE:N)"
            )
        sizes: dict[str, int] = {}
        for queue, size in queues:
            if queue in sizes:
                raise CommandError(f"queue {queue!r} is given twice; give each queue once, as QUEUE or QUEUE:N")
            # A queue named without a size, beside sized ones, gets --concurrency threads.
            sizes[queue] = size or options["concurrency"]
        return sizes


def _joined_at_exit() -> bool:
    """Whether a thread the interpreter's exit would join is alive: one not a daemon, or a concurrent.futures one.

    Only then does a stuck job keep the process from exiting; otherwise (a sync job's daemon thread
    blocked in C) leaving by os._exit ended a program that runs the command itself (call_command)
    under its feet, its own code after the call never run (fifth review).
    """
    # Joined at exit (threading._register_atexit), daemon or not: thread pools' workers, process pools' managers.
    pooled = {*getattr(futures_thread, "_threads_queues", {}), *getattr(futures_process, "_threads_wakeups", {})}
    here = threading.current_thread()
    return any(
        thread is not here and thread.is_alive() and (not thread.daemon or thread in pooled)
        for thread in threading.enumerate()
    )
