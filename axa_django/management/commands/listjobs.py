"""python manage.py listjobs: print every registered job with its options and schedule."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from axa_django.management.listing import describe_jobs, format_table


class Command(BaseCommand):
    help = "List registered background jobs: name, queue, priority, max attempts, cron schedule and next run."

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = describe_jobs()
        self.stdout.write(format_table(jobs))
        if not jobs:
            self.stdout.write("no jobs registered (jobs are found in each installed app's jobs.py)")
