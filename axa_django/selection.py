"""What a worker is told to claim (job names, queues), checked before it starts."""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

from django.db import connections

from . import conf, registry
from .checks import tasks_framework_problem
from .exceptions import UnknownJobs, UnknownQueues

# Known names listed in the error; listjobs shows them all.
LISTED = 50
# Distinct queues of queued rows looked at, each one index descent.
MOST_QUEUES = 1000

# The queues of queued rows, by a loose index scan of axa_queue_claim_all_queue (queued said
# as that index says it, models.py, and "queue >= ''" for its "queue IS NOT NULL", which
# PostgreSQL 17 and later drop from a query on a NOT NULL column; one descent per queue:
# a SELECT DISTINCT would read every queued row), and the queues an operator paused or limited.
# ONLY axa_queue: the history tables under it hold no queued row, and each descent read
# every one's index too (40 closed tables: 79 pages a queue).
TABLE_QUEUES = """
WITH RECURSIVE queues AS (
    (SELECT 1 AS n, queue FROM ONLY axa_queue WHERE status BETWEEN 'queued' AND 'queued' AND queue >= ''
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT p.n + 1, x.queue FROM queues p CROSS JOIN LATERAL (
        SELECT queue FROM ONLY axa_queue WHERE status BETWEEN 'queued' AND 'queued' AND queue > p.queue
        ORDER BY queue LIMIT 1
    ) AS x WHERE p.n < %(most)s
)
SELECT queue FROM queues
UNION SELECT queue FROM axa_paused_queue
UNION SELECT queue FROM axa_queue_limit
"""


def task_backend_aliases() -> list[str]:
    """settings.TASKS aliases whose backend is axa_django's QueueBackend (none without a tasks framework)."""
    if tasks_framework_problem() is not None:
        return []  # Django 5.2 without the django-tasks backport (check E104 says so if TASKS wants it)
    # Lazy: backends imports the tasks framework, which a project may not have (Django 5.2).
    from .backends import queue_backend_aliases

    return queue_backend_aliases()


def check_queue(queue: object) -> str:
    """``queue`` if it can name a queue; ValueError saying why not (empty, control characters, spaces around it)."""
    if not isinstance(queue, str):
        raise ValueError(f"a queue name must be a string, not {type(queue).__name__}")
    if not queue.strip():
        raise ValueError(f"a queue name cannot be empty or blank, got {queue!r}")
    if any(unicodedata.category(char) == "Cc" for char in queue):
        raise ValueError(f"a queue name cannot contain control characters, got {queue!r}")
    if queue != queue.strip():
        # No job could be meant: a shell quoting slip would leave the worker idle.
        raise ValueError(f"a queue name cannot start or end with whitespace, got {queue!r}")
    return queue


def check_names(names: Iterable[str]) -> list[str]:
    """``names`` sorted and unique; UnknownJobs naming each unknown one, with the known jobs listed."""
    wanted = sorted(set(names))
    known = sorted(registry.registry)
    unknown = [name for name in wanted if name not in registry.registry]
    if not unknown:
        return wanted
    lines = [f"no job is registered as {', '.join(map(repr, unknown))}."]
    for name in unknown:
        guesses = suggestions(name, known)
        if guesses:
            lines.append(f"For {name!r}, did you mean {' or '.join(map(repr, guesses))}?")
    listing = [f"  {name}" for name in known[:LISTED]] or ["  (none: no app's jobs.py defines a job)"]
    if len(known) > LISTED:
        listing.append(f"  ... and {len(known) - LISTED} more")
    lines.append("Known jobs (python manage.py listjobs):\n" + "\n".join(listing))
    raise UnknownJobs("\n".join(lines))


def suggestions(name: str, known: list[str]) -> list[str]:
    """Known names ``name`` was probably meant as: the same last dotted part, then close spellings."""
    tail = name.rsplit(".", 1)[-1].lower()
    same_tail = [k for k in known if k.rsplit(".", 1)[-1].lower() == tail]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    return list(dict.fromkeys(same_tail + close))[:3]


def table_queues(using: str | None = None) -> set[str]:
    """Queues that hold queued rows (the first MOST_QUEUES by name), are paused, or have a limit."""
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        cursor.execute(TABLE_QUEUES, {"most": MOST_QUEUES})
        return {queue for (queue,) in cursor.fetchall()}


def check_known_queues(
    wanted: Iterable[str], *, new: Iterable[str] = (), declared: Iterable[str] = (), using: str | None = None
) -> None:
    """UnknownQueues unless each of ``wanted`` is known, with the closest known queues.

    Known: in ``declared`` (django.tasks backends' QUEUES), AXA_DJANGO["KNOWN_QUEUES"], a
    registered job's queue, or the table's (``table_queues``, read only when the code does
    not settle it). ``new`` queues are taken as they are. A database error is raised as it comes.
    """
    known = {job.options.queue for job in registry.registry.values()} | set(declared) | set(new)
    known |= set(conf.get("KNOWN_QUEUES"))
    doubtful = sorted(set(wanted) - known)
    if not doubtful:
        return
    known |= table_queues(using)
    unknown = [queue for queue in doubtful if queue not in known]
    if not unknown:
        return
    listed = sorted(known)
    it = "them" if len(unknown) > 1 else "it"
    lines = [
        f"unknown queue{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: no registered job "
        f"declares {it}, no queued job is in {it}, and no QueueBackend in settings.TASKS lists {it}."
    ]
    for queue in unknown:
        guesses = difflib.get_close_matches(queue, listed, n=3, cutoff=0.6)
        if guesses:
            lines.append(f"For {queue!r}, did you mean {' or '.join(map(repr, guesses))}?")
    shown = ", ".join(listed[:LISTED]) or "none"
    more = f" and {len(listed) - LISTED} more" if len(listed) > LISTED else ""
    lines.append(f"Known queues (python manage.py queues): {shown}{more}.")
    lines.append("If it is a new queue whose first jobs are yet to come, give it with --new-queue instead of --queue.")
    raise UnknownQueues("\n".join(lines))
