"""A table of the registered jobs, for ``manage.py listjobs``."""

from __future__ import annotations

import datetime
from typing import Any

from .. import conf, cron, registry


def describe_jobs(now: datetime.datetime | None = None) -> list[dict[str, Any]]:
    """One dict per registered job: name, queue, priority, max_attempts, cron, next_run."""
    described = []
    for name, job in sorted(registry.registry.items()):
        runs = cron.next_runs(job, 1, after=now) if job.cron else []
        described.append(
            {
                "name": name,
                "queue": job.options.queue,
                "priority": job.options.priority,
                "max_attempts": job.max_attempts or conf.get("MAX_ATTEMPTS"),
                "unique": job.unique is not None,
                "takes_context": job.takes_context,
                "cron": job.cron,
                "next_run": runs[0] if runs else None,
            }
        )
    return described


def format_table(jobs: list[dict[str, Any]]) -> str:
    """Render ``describe_jobs()`` as aligned text columns."""
    header = ["NAME", "QUEUE", "PRIORITY", "MAX_ATTEMPTS", "SCHEDULE", "NEXT RUN"]
    lines = [header]
    for job in jobs:
        lines.append(
            [
                job["name"],
                job["queue"],
                str(job["priority"]),
                str(job["max_attempts"]),
                job["cron"] or "-",
                job["next_run"].isoformat() if job["next_run"] else "-",
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines)
