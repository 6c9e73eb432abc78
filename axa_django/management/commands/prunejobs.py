"""python manage.py prunejobs --older-than 7d: delete old finished jobs in batches."""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from axa_django import pruning


def _duration(text: str) -> datetime.timedelta:
    try:
        return pruning.parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _batch_size(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


class Command(BaseCommand):
    help = (
        "Delete finished jobs (completed, failed, cancelled) older than a duration, "
        "in batches of a few thousand rows, each in its own transaction."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--older-than", type=_duration, required=True, help="age such as 30s, 15m, 12h, 7d or 2w")
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            choices=pruning.FINISHED,
            help="prune only this status (repeatable; default: all finished statuses)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
        parser.add_argument("--batch-size", type=_batch_size, default=pruning.BATCH_SIZE, help="rows per batch")

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = options["older_than"]
        statuses = options["statuses"] or list(pruning.FINISHED)
        what = f"{'/'.join(sorted(set(statuses)))} jobs older than {pruning.format_duration(older_than)}"
        try:
            if options["dry_run"]:
                self.stdout.write(f"would delete {pruning.count(older_than, statuses)} {what}")
                return

            def progress(deleted: int, total: int) -> None:
                if options["verbosity"] > 0 and deleted:
                    self.stdout.write(f"deleted {deleted} (total {total})")

            total = pruning.prune(older_than, statuses, batch_size=options["batch_size"], progress=progress)
        except (ValueError, RuntimeError) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"deleted {total} {what}")
