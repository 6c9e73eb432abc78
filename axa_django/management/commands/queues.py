"""python manage.py queues [pause QUEUE [--reason TEXT] | resume QUEUE]: list, pause and resume queues."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from axa_django import queues


class Command(BaseCommand):
    help = "List queues (ready, running, paused, limits); pause or resume one for every worker."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{pause,resume}")
        pause = actions.add_parser("pause", help="stop every worker claiming this queue's jobs")
        pause.add_argument("queue")
        pause.add_argument("--reason", default="", help="shown in `queues` and the admin")
        resume = actions.add_parser("resume", help="let workers claim this queue again (wakes them at once)")
        resume.add_argument("queue")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options.get("action")
        try:
            if action == "pause":
                changed = queues.pause(options["queue"], options["reason"], by="manage.py queues")
                self.stdout.write(f"queue {options['queue']!r} {'paused' if changed else 'was already paused'}")
                return
            if action == "resume":
                changed = queues.resume(options["queue"])
                self.stdout.write(f"queue {options['queue']!r} {'resumed' if changed else 'was not paused'}")
                return
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from None
        listed = queues.overview()
        self.stdout.write(
            queues.format_table(listed) if listed else "no queues: no jobs are queued, running or registered"
        )
