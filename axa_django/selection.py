"""What a worker is told to claim (job names, queues), checked before it starts."""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

from . import registry

# Known names listed in the error; listjobs shows them all.
LISTED = 50


class UnknownJobs(ValueError):
    """A worker was asked for job names that no registered job has."""


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
