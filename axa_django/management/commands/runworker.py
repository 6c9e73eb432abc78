"""python manage.py runworker: run background jobs until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from axa_django.budget import start_line
from axa_django.health import check_health_file
from axa_django.logs import configure_for_command
from axa_django.selection import check_queue
from axa_django.worker import CannotConnect, NotMigrated, PoolerMisconfigured, UnknownJobs, Worker


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str, allow_zero: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value >= 0 if allow_zero else value > 0) or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a {'' if allow_zero else 'positive '}number of seconds, got {text}")
    return value


def _grace(text: str) -> float:
    return _seconds(text, allow_zero=True)


def _health_file(text: str) -> str:
    try:
        return check_health_file(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _queue(text: str) -> str:
    try:
        return check_queue(text)
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
            help="most rows claimed ahead of free threads, for short jobs (default 8 x concurrency; 0: none)",
        )
        parser.add_argument("--poll-interval", type=_seconds, default=None, help="seconds between polls when idle")
        parser.add_argument("--burst", action="store_true", help="run every ready job, then exit 0")
        parser.add_argument("--max-jobs", type=_positive_int, default=None, help="exit after this many attempts")
        parser.add_argument(
            "--queue", action="append", dest="queues", type=_queue, help="claim only from this queue (repeatable)"
        )
        parser.add_argument("--job", action="append", dest="names", help="claim only this job name (repeatable)")
        parser.add_argument(
            "--grace-period",
            type=_grace,
            default=None,
            help="seconds jobs may finish after SIGTERM (default: no limit)",
        )
        parser.add_argument(
            "--health-file",
            type=_health_file,
            default=None,
            help="touch this file at start and at each heartbeat (for exec probes that cannot reach the database)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        configure_for_command(options["verbosity"])
        try:
            worker = Worker(
                concurrency=options["concurrency"],
                poll_interval=options["poll_interval"],
                burst=options["burst"],
                max_jobs=options["max_jobs"],
                queues=options["queues"],
                names=options["names"],
                grace_period=options["grace_period"],
                log_attempts=options["verbosity"] >= 2,
                prefetch=options["prefetch"],
            )
        except UnknownJobs as error:
            raise CommandError(str(error), returncode=2) from None
        except ValueError as error:
            raise CommandError(str(error)) from None
        worker.health_file = options["health_file"]
        logging.getLogger("axa_django").info(start_line(worker.concurrency, worker.notify))
        try:
            code = worker.run()
        except (CannotConnect, NotMigrated, PoolerMisconfigured) as error:
            raise CommandError(str(error), returncode=2) from None
        if code:
            sys.exit(code)
