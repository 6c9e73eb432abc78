"""python manage.py queues [pause QUEUE [--reason TEXT] | resume QUEUE | limit QUEUE N|none]: manage queues."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from axa_django import queues


def _max_running(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= queues.MAX_RUNNING:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a limit: give a whole number from 1 to {queues.MAX_RUNNING}, or 'none' to lift it"
        )
    return value


class Command(BaseCommand):
    help = "List queues (ready, running, paused, limits); pause, resume or limit one for every worker."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="{pause,resume,limit}")
        pause = actions.add_parser("pause", help="stop every worker claiming this queue's jobs")
        pause.add_argument("queue")
        pause.add_argument("--reason", default="", help="shown in `queues` and the admin")
        resume = actions.add_parser("resume", help="let workers claim this queue again (wakes them at once)")
        resume.add_argument("queue")
        limit = actions.add_parser(
            "limit", help="let at most N jobs of this queue run at once across every worker ('none' lifts it)"
        )
        limit.add_argument("queue")
        limit.add_argument("max_running", metavar="N", type=_max_running)

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
            if action == "limit":
                queue, wanted = options["queue"], options["max_running"]
                before = queues.unlimit(queue) if wanted is None else queues.limit(queue, wanted, by="manage.py queues")
                was = "no limit" if before is None else f"at most {before} running"
                now = "no limit" if wanted is None else f"at most {wanted} running"
                self.stdout.write(f"queue {queue!r}: {now} across all workers (was: {was})")
                return
        except (TypeError, ValueError) as error:
            raise CommandError(str(error)) from None
        listed = queues.overview()
        self.stdout.write(
            queues.format_table(listed) if listed else "no queues: no jobs are queued, running or registered"
        )
