"""Ready jobs that no live worker claims: found for the dashboard, warned about by workers.

A live worker is one whose heartbeat is younger than LEASE_SECONDS; it claims the job
names and django.tasks backends recorded on its ``axa_worker`` row, in its queues
(all when it has none). Workers that do not register there (the Rust seed's) are not
seen, so the jobs only they run are reported too.
"""

from __future__ import annotations

import difflib
import logging
import shlex
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple

from django.db import connections

from . import conf, sql

logger = logging.getLogger("axa_django")

# Ready rows counted per name and queue: beyond this the count reads "at least CAP".
CAP = 1000
# Distinct (queue, name) and (queue, backend) pairs looked at, each one index descent.
PAIRS = 1000
# A running worker looks once a minute; its first look waits a lease (workers started
# together have all registered by then). Of a fleet, only the eldest live worker looks,
# and it says each (name or backend, queue) once, the first time it finds it, and again
# only after a look found it gone. At start every worker looks once for names its own
# code does not know (warn_at_start). On 1,005,000 ready rows of 21 names in 4 queues
# (PostgreSQL 15, 2 cores) sql.UNHANDLED read 183 of the table's 23,373 pages in 4-7 ms,
# FLEET 7 pages in under a millisecond: a look costs the fleet that, once a minute.
CHECK_SECONDS = 60.0
# A key is said again at most this often, gone or not in between: a key found at one look
# and not at the next (a pool in a crash loop, a burst worker run by cron) was said at
# every other look.
WARN_SECONDS = 600.0

# Keys said and still found at the last look: (name, backend, queue); and when each key
# was last said (monotonic seconds), kept for WARN_SECONDS.
_said: set[tuple[str | None, str | None, str]] = set()
_said_at: dict[tuple[str | None, str | None, str], float] = {}


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


# Runs one statement and returns its rows, or None when it failed (already logged).
Execute = Callable[[str, dict[str, Any]], list[tuple[Any, ...]] | None]


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


class Fleet(NamedTuple):
    """What the live workers claim: the names, backends and queues on their ``axa_worker`` rows."""

    names: frozenset[str]
    backends: frozenset[str]
    queues: frozenset[str]  # the queues named by workers that claim from some queues only
    every_queue: bool  # whether a live worker claims from every queue

    @classmethod
    def of(cls, rows: Iterable[tuple[Any, ...]]) -> Fleet:
        """From ``FLEET``'s rows."""
        names: set[str] = set()
        backends: set[str] = set()
        queues: set[str] = set()
        every_queue = False
        for _, row_names, row_queues, row_backends in rows:
            names.update(row_names or [])
            backends.update(row_backends or [])
            queues.update(row_queues or [])
            every_queue = every_queue or not row_queues
        return cls(frozenset(names), frozenset(backends), frozenset(queues), every_queue)


# The live workers, eldest first: the eldest says what no live worker claims (one line for
# a fleet, not one per worker), and what they claim is what a misspelt name or queue is
# matched against. A few rows: one per worker process (or per-queue pool).
FLEET = """
SELECT id, names, queues, backends FROM axa_worker
WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)
ORDER BY started_at, id
"""


def _close(word: str, known: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(word, sorted(known), n=1)
    return found[0] if found else None


def advice(entry: Unhandled, fleet: Fleet | None = None) -> str:
    """What to do about ``entry``: start a worker for its queue, or fix a misspelt name or queue
    (matched against what ``fleet`` claims); without a fleet, where a job must be for workers to know it."""
    if entry.backend is None:
        what, known, kind = entry.name or "", fleet.names if fleet else frozenset(), "job"
    else:
        what, known, kind = entry.backend, fleet.backends if fleet else frozenset(), "backend"
    if what in known:
        text = (
            f"live workers run this {kind} but none claims from queue {entry.queue!r}: start one that does "
            f"(python manage.py runworker --queue {shlex.quote(entry.queue)})"
        )
    elif (guess := _close(what, known)) is not None:
        text = f"no live worker runs it: did you mean {guess!r}? (a name misspelt where it was enqueued)"
    elif entry.backend is None:
        text = (
            "is the job in the jobs.py of an installed app (a startproject's settings package is not one), "
            "or imported by one, in the workers' code? Or was it renamed?"
        )
    else:
        text = "does a worker's settings.TASKS name this backend, and does a worker run this queue?"
    if fleet is not None and not fleet.every_queue and entry.queue not in fleet.queues:
        guess = _close(entry.queue, fleet.queues)
        if guess is not None:
            text += f"; no live worker claims from this queue: did you mean queue {guess!r}?"
    return text


def warn(found: Iterable[Unhandled], fleet: Fleet | None = None, now: float | None = None) -> list[Unhandled]:
    """Log a warning for each entry not said yet in this process (nor in the last WARN_SECONDS), with
    ``advice``; return those."""
    now = time.monotonic() if now is None else now
    said = []
    for entry in found:
        key = (entry.name, entry.backend, entry.queue)
        if key in _said:
            continue
        _said.add(key)  # found again within WARN_SECONDS: the same spell, said when it ends and comes back
        if now - _said_at.get(key, now - WARN_SECONDS) < WARN_SECONDS:
            continue
        _said_at[key] = now
        said.append(entry)
        count = f"at least {entry.ready}" if entry.ready >= CAP else str(entry.ready)
        logger.warning(
            "%s: %s ready and no live worker claims them (%s); said once, python manage.py jobhealth lists them "
            "while it lasts",
            entry.describe(),
            count,
            advice(entry, fleet),
        )
    return said


def look(execute: Execute, *, worker: uuid.UUID | None, lease: float, now: float | None = None) -> list[Unhandled]:
    """A running worker's look: if it is the eldest live worker (or has no id), warn about each new
    entry of ready jobs no live worker claims, and forget those no longer found; return what it said."""
    rows = execute(FLEET, {"lease": lease})
    if rows is None or (worker is not None and (not rows or rows[0][0] != worker)):
        return []  # not read, or another worker says it
    found = execute(sql.UNHANDLED, params(lease))
    if found is None:
        return []
    entries = rows_to_unhandled(found)
    _said.intersection_update([(entry.name, entry.backend, entry.queue) for entry in entries])
    now = time.monotonic() if now is None else now
    for key in [key for key, at in _said_at.items() if now - at >= WARN_SECONDS]:
        del _said_at[key]
    return warn(entries, Fleet.of(rows), now)


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


def warn_at_start(execute: Execute, *, lease: float, registered: Collection[str]) -> list[Unhandled]:
    """At a worker's start, warn at once about ready jobs no live worker claims whose name this process does not know,
    each with the closest name it knows.

    Names it knows (left out by --job or --queue) wait for the first full look a lease
    later: workers started beside it that run them may not have registered yet.
    """
    found = rows_to_unhandled(execute(sql.UNHANDLED, params(lease)) or [])
    known = Fleet(frozenset(registered), frozenset(), frozenset(), every_queue=True)
    return warn([entry for entry in found if entry.backend is None and entry.name not in registered], known)


def left_behind(
    execute: Execute,
    *,
    names: Sequence[str],
    backends: Sequence[str],
    queues: Sequence[str] | None,
    lease: float,
    registered: Collection[str] = (),
    every_name: bool = True,
) -> list[str]:
    """What a worker leaves when it stops: ready jobs it was asked to run and could not, each with why.

    Run while the worker is still registered: in its queues (all, without ``queues``),
    the jobs no live worker claims (names this process does not know, django.tasks
    backends it does not run), then those it would claim but that wait in a paused
    queue. Other queues (``--queue``), and other names (``every_name`` False: ``--job``),
    are not its to run: the fleet's running workers warn about those no one claims.
    ``registered``: every job name this process knows.
    """
    said = []
    for entry in rows_to_unhandled((execute(sql.UNHANDLED, params(lease)) or []) if every_name else []):
        if queues is None or entry.queue in queues:
            said.append(f"{_count(entry.ready)} of {entry.describe()} ({_why(entry, backends, registered)})")
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


def _why(entry: Unhandled, backends: Sequence[str], registered: Collection[str]) -> str:
    if entry.backend is not None:
        if not backends:
            return "this worker runs no django.tasks backend (none in settings.TASKS)"
        return f"this worker runs the backends {', '.join(map(repr, backends))} (settings.TASKS)"
    guess = _close(entry.name or "", registered)
    if guess is not None:
        return (
            f"no job of that name is registered here: did you mean {guess!r}? (a name misspelt where it was enqueued)"
        )
    return "no job of that name is registered here: renamed, or its module not imported by an app's jobs.py?"


def reset() -> None:
    """Forget what was warned about (tests)."""
    _said.clear()
    _said_at.clear()
