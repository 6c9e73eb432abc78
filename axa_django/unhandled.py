"""Ready jobs that no live worker claims: found for the dashboard, warned about by workers.

A live worker is one whose heartbeat is younger than LEASE_SECONDS; it claims the job
names and django.tasks backends recorded on its ``axa_worker`` row, in its queues
(all when it has none). Workers that do not register there (the Rust seed's) are not
seen, so the jobs only they run are reported too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any, NamedTuple

from django.db import connections

from . import conf, sql

logger = logging.getLogger("axa_django")

# Ready rows counted per name and queue: beyond this the count reads "at least CAP".
CAP = 1000
# Distinct (queue, name) and (queue, backend) pairs looked at, each one index descent.
PAIRS = 1000
# A worker looks once a minute, and says each name again at most every ten minutes.
# Its first full look waits a lease (workers started together have all registered
# by then); at start it looks once for names its own code does not know (warn_at_start).
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
            hint = (
                "is the job in the jobs.py of an installed app (a startproject's settings package is not one), "
                "or imported by one, in the workers' code? Or was it renamed?"
            )
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


# Ready rows of paused queues that a worker would claim (its names and backends, in its
# queues), per queue: one walk of axa_queue_claim_queue per paused queue.
PAUSED_READY = """
SELECT p.queue, (
    SELECT count(*) FROM (
        SELECT 1 FROM axa_queue q
        WHERE q.status BETWEEN 'queued' AND 'queued' AND q.queue = p.queue AND q.run_at <= now()
          AND ((q.backend IS NULL AND q.name = ANY(%(names)s)) OR q.backend = ANY(%(backends)s))
        LIMIT %(cap)s) AS c) AS ready
FROM axa_paused_queue p
WHERE %(every_queue)s OR p.queue = ANY(%(queues)s)
ORDER BY ready DESC, p.queue
"""

# Runs one statement and returns its rows, or None when it failed (already logged).
Execute = Callable[[str, dict[str, Any]], list[tuple[Any, ...]] | None]


def warn_at_start(execute: Execute, *, lease: float, registered: Container[str]) -> list[Unhandled]:
    """At a worker's start, warn at once about ready jobs no live worker claims whose name this process does not know.

    Names it knows (left out by --job or --queue) wait for the first full look a lease
    later: workers started beside it that run them may not have registered yet.
    """
    found = rows_to_unhandled(execute(sql.UNHANDLED, params(lease)) or [])
    return warn([entry for entry in found if entry.backend is None and entry.name not in registered])


def left_behind(
    execute: Execute,
    *,
    names: Sequence[str],
    backends: Sequence[str],
    queues: Sequence[str] | None,
    lease: float,
    registered: Container[str] = (),
) -> list[str]:
    """What a worker leaves when it stops: ready jobs it could not run, each with why, most first.

    Run while the worker is still registered: the jobs no live worker claims (the names
    it has no handler for, the queues it does not run), then those it would claim but
    that wait in a paused queue. ``registered``: every job name this process knows.
    """
    said = []
    for entry in rows_to_unhandled(execute(sql.UNHANDLED, params(lease)) or []):
        said.append(f"{_count(entry.ready)} of {entry.describe()} ({_why(entry, backends, queues, registered)})")
    paused = execute(
        PAUSED_READY,
        {
            "names": list(names),
            "backends": list(backends),
            "cap": CAP,
            "every_queue": queues is None,
            "queues": list(queues or []),
        },
    )
    for queue, ready in paused or []:
        if ready:
            said.append(
                f"{_count(int(ready))} in queue {queue!r}, which is paused (python manage.py queues resume {queue})"
            )
    return said


def _count(ready: int) -> str:
    return f"at least {ready}" if ready >= CAP else str(ready)


def _why(entry: Unhandled, backends: Sequence[str], queues: Sequence[str] | None, registered: Container[str]) -> str:
    if queues is not None and entry.queue not in queues:
        return f"this worker runs only {', '.join(map(repr, queues))} (--queue)"
    if entry.backend is not None:
        if not backends:
            return "this worker runs no django.tasks backend (--job, or none in settings.TASKS)"
        return f"this worker runs the backends {', '.join(map(repr, backends))} (settings.TASKS)"
    if entry.name in registered:
        return "not one of this worker's --job names"
    return "no job of that name is registered here: renamed, or its module not imported by an app's jobs.py?"


def reset() -> None:
    """Forget what was warned about (tests)."""
    _warned.clear()
