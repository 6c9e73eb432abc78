"""python manage.py jobhealth: exit 0 when the queue is healthy, 1 (one line per reason) when not."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from axa_django.management.argtypes import seconds, whole
from axa_django.ops import health
from axa_django.selection import check_queue


def _workers(text: str) -> int:
    return whole(text, 1, "workers")


def _queue(text: str) -> str:
    try:
        return check_queue(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


class Command(BaseCommand):
    help = (
        "Check the job queue: exit 0 when healthy, 1 when not (one line per reason). For Kubernetes probes, cron "
        "checks and alerting; --json prints the figures too."
    )
    requires_system_checks: list[str] = []  # a probe answers fast, and only about the queue

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--max-ready-age", type=seconds, default=None, help="unhealthy if a ready job has waited longer (seconds)"
        )
        parser.add_argument(
            "--require-workers", type=_workers, default=None, help="unhealthy with fewer live workers than this"
        )
        parser.add_argument(
            "--queue", action="append", dest="queues", type=_queue, help="judge only this queue (repeatable)"
        )
        parser.add_argument("--json", action="store_true", help="print the verdict and the figures as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        queues = sorted(set(options["queues"])) if options["queues"] else None
        try:
            report = health.check(
                max_ready_age=options["max_ready_age"], require_workers=options["require_workers"], queues=queues
            )
        except (DatabaseError, psycopg.Error) as error:
            text = " ".join(str(error).split()) or type(error).__name__  # one line, whatever the driver says
            report = health.Report(None, [f"cannot read the queue database: {text}"])
        except ValueError as error:
            raise CommandError(str(error)) from None
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        else:
            for reason in report.reasons:
                self.stdout.write(f"unhealthy: {reason}")
            if report.healthy and report.snapshot is not None:
                s = report.snapshot
                ready = sum(q.ready for q in s.queues)
                oldest = max((q.oldest_ready_seconds or 0.0 for q in s.queues), default=0.0)
                self.stdout.write(
                    f"healthy: {len(s.live_workers)} live worker(s), {ready:,} ready job(s), "
                    f"oldest ready {oldest:,.1f}s"
                )
            if report.snapshot is not None and report.snapshot.history_refused:
                # Not a reason to restart anything: the jobs ran; a user's constraint wants fixing.
                self.stdout.write(
                    f"note: {report.snapshot.history_refused:,} finished job(s) kept in axa_queue: the database "
                    "refused their move into the history (a foreign key to Job with a database constraint? "
                    "declare it with db_constraint=False); their errors say why"
                )
        if not report.healthy:
            sys.exit(1)
