"""Ready jobs that no live worker claims: found for the dashboard, warned about by workers.

A live worker is one whose heartbeat is younger than LEASE_SECONDS; it claims the job
names and django.tasks backends recorded on its ``axa_worker`` row, in its queues
(all when it has none). Workers that do not register there (the Rust seed's) are not
seen, so the jobs only they run are reported too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from django.db import connections

from . import conf, sql

logger = logging.getLogger("axa_django")

# Ready rows counted per name and queue: beyond this the count reads "at least CAP".
CAP = 1000
# Distinct (queue, name) and (queue, backend) pairs looked at, each one index descent.
PAIRS = 1000
# A worker looks once a minute, and says each name again at most every ten minutes.
CHECK_SECONDS = 60.0
WARN_SECONDS = 600.0

_warned: dict[tuple[str | None, str | None, str], float] = {}


class Unhandled(NamedTuple):
    """Ready jobs of one name (or django.tasks backend) in one queue that no live worker claims."""

    name: str | None  # None for django.tasks rows, claimed by backend
    backend: str | None
    queue: str
    ready: int  # at most CAP: then at least that many

    def describe(self) -> str:
        """What these jobs are, in words: ``job 'x' in queue 'default'``."""
        what = f"job {self.name!r}" if self.backend is None else f"django.tasks backend {self.backend!r}"
        return f"{what} in queue {self.queue!r}"


def params(lease: float | None = None) -> dict[str, Any]:
    """The parameters of ``sql.UNHANDLED``."""
    lease = float(conf.get("LEASE_SECONDS")) if lease is None else lease
    return {"lease": lease, "cap": CAP, "pairs": PAIRS}


def find(using: str | None = None) -> list[Unhandled]:
    """Ready jobs no live worker claims, most first: one entry per name (or backend) and queue."""
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        cursor.execute(sql.UNHANDLED, params())
        return rows_to_unhandled(cursor.fetchall())


def rows_to_unhandled(rows: Iterable[tuple[Any, ...]]) -> list[Unhandled]:
    """``sql.UNHANDLED``'s rows as Unhandled."""
    return [Unhandled(name, backend, queue, int(ready)) for name, backend, queue, ready in rows]


def warn(found: Iterable[Unhandled], now: float | None = None) -> list[Unhandled]:
    """Log a warning for each entry not warned about in this process within WARN_SECONDS; return those."""
    now = time.monotonic() if now is None else now
    said = []
    for entry in found:
        key = (entry.name, entry.backend, entry.queue)
        if now - _warned.get(key, -WARN_SECONDS) < WARN_SECONDS:
            continue
        _warned[key] = now
        said.append(entry)
        count = f"at least {entry.ready}" if entry.ready >= CAP else str(entry.ready)
        if entry.backend is None:
            hint = "is the job's module imported by an app's jobs.py in the workers' code, or was the job renamed?"
        else:
            hint = "does a worker's settings.TASKS name this backend, and does a worker run this queue?"
        logger.warning(
            "%s: %s ready and no live worker claims them (%s); said again in %.0f minutes if still so",
            entry.describe(),
            count,
            hint,
            WARN_SECONDS / 60,
        )
    return said


def reset() -> None:
    """Forget what was warned about (tests)."""
    _warned.clear()
