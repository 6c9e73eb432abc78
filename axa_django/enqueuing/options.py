"""The options a job is enqueued with, and the checks at the boundary that refuse bad ones before any SQL."""

from __future__ import annotations

import datetime
import re
import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.utils import timezone

from .. import dependencies

MAX_NAME_LENGTH = 200
# Control characters (Unicode category Cc), line separators and lone surrogates: a
# name or key holding one cannot be stored (NUL), sent (surrogates) or shown on one line.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
# Later than this, now() + delay leaves PostgreSQL's timestamp range.
MAX_DELAY = datetime.timedelta(days=3_650_000)


@dataclass(frozen=True)
class Options:
    """Per-call options; None means the job's own default."""

    queue: str = "default"
    priority: int = 0
    run_at: datetime.datetime | None = None
    delay: datetime.timedelta | None = None
    unique_key: str | None = None
    max_attempts: int | None = None
    max_losses: int | None = None
    on_duplicate: str = "return"
    backend: str | None = None
    # Flow control (flow.py): seconds per attempt, and the keys of the job's limits.
    timeout: float | None = None
    concurrency_key: str | None = None
    rate_key: str | None = None
    # Workflows: the parent jobs' ids, what to do if one fails, and the group written with.
    after: tuple[uuid.UUID, ...] = ()
    on_parent_failure: str = "cancel"
    workflow: uuid.UUID | None = None

    def checked(self) -> Options:
        """Return these options, validated (``delay`` is added to now() at enqueue, by the database)."""
        if not isinstance(self.queue, str) or not self.queue:
            raise ValueError(f"queue must be a non-empty str, not {self.queue!r}")
        check_text(self.queue, "queue name")
        if type(self.priority) is not int or not -(2**31) <= self.priority < 2**31:
            raise ValueError(f"priority must be an int between -2147483648 and 2147483647, not {self.priority!r}")
        if self.max_attempts is not None and (type(self.max_attempts) is not int or not 0 < self.max_attempts < 2**31):
            raise ValueError(f"max_attempts must be a positive int below 2147483648, not {self.max_attempts!r}")
        if self.max_losses is not None and (type(self.max_losses) is not int or not 0 < self.max_losses < 2**31 - 1):
            raise ValueError(
                f"max_losses must be a positive int (times the job's worker may die under it), not {self.max_losses!r}"
            )
        if self.unique_key is not None and not isinstance(self.unique_key, str):
            raise TypeError(f"unique_key must be a str, not {type(self.unique_key).__name__}")
        if self.unique_key is not None:
            check_text(self.unique_key, "unique key")
        if self.backend is not None:
            check_text(self.backend, "backend alias")
        check_flow(self)
        if not isinstance(self.after, tuple) or not all(isinstance(a, uuid.UUID) for a in self.after):
            return replace(self, after=dependencies.parent_ids(self.after)).checked()
        dependencies.check_policy(self.on_parent_failure)
        if (self.after or self.workflow is not None) and self.unique_key is not None:
            raise ValueError(
                "a job with after= (or in a workflow or batch) cannot have a unique key: a waiting job does not "
                "hold its key; drop unique_key (or the job's unique=), or enqueue it on its own"
            )
        if self.on_duplicate not in ("return", "raise"):
            raise ValueError(f"on_duplicate must be 'return' or 'raise', not {self.on_duplicate!r}")
        run_at = self.run_at
        if run_at is not None:
            if not isinstance(run_at, datetime.datetime):
                raise TypeError(f"run_at must be a datetime, not {type(run_at).__name__}")
            if run_at.tzinfo is None or run_at.utcoffset() is None:
                if settings.USE_TZ:
                    raise ValueError("run_at must be timezone-aware; use django.utils.timezone.now() + timedelta(...)")
                # USE_TZ = False: a naive datetime is in TIME_ZONE, as Django's own fields read it.
                return replace(self, run_at=timezone.make_aware(run_at, timezone.get_default_timezone())).checked()
        if self.delay is not None:
            if not isinstance(self.delay, datetime.timedelta):
                raise TypeError(f"delay must be a timedelta, not {type(self.delay).__name__}")
            if run_at is not None:
                raise ValueError("pass run_at or delay, not both")
            if abs(self.delay) > MAX_DELAY:
                raise ValueError(f"delay must be at most {MAX_DELAY.days} days, not {self.delay}")
        return self


def check_flow(options: Options) -> None:
    """Refuse a timeout or limit key that no worker could honour."""
    timeout = options.timeout
    if timeout is not None:
        if not isinstance(timeout, int | float) or isinstance(timeout, bool):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if not 0 < timeout <= MAX_DELAY.total_seconds():
            raise ValueError(
                f"timeout is {timeout!r}; it must be a number of seconds above 0 "
                f"(and at most {MAX_DELAY.total_seconds():.0f}); leave it out for no timeout"
            )
    for what in ("concurrency_key", "rate_key"):
        key = getattr(options, what)
        if key is not None:
            if not isinstance(key, str):
                raise TypeError(f"{what} must be a str, not {type(key).__name__}")
            if not key:
                raise ValueError(f"{what} must not be empty")
            if len(key) > 200:  # flow.MAX_KEY_LENGTH (flow sits above this module)
                raise ValueError(f"{what} is {len(key)} characters long; the limit is 200")
            check_text(key, what.replace("_", " "))


def check_text(value: str, what: str) -> str:
    """Return ``value`` unless it holds a control character, line break or lone surrogate."""
    found = _UNPRINTABLE.search(value)
    if found is not None:
        char = found.group()
        raise ValueError(
            f"{what} {value!r} contains the unprintable character {char!r} (U+{ord(char):04X}) at index "
            f"{found.start()}; PostgreSQL cannot store NUL, and logs and the admin show names on one line. "
            f"Use a {what} of printable characters only."
        )
    return value


def check_name(name: Any) -> str:
    """Return ``name`` if it can name a job, else raise."""
    if not isinstance(name, str):
        raise TypeError(f"job name must be a str, not {type(name).__name__}")
    if not name.strip():
        raise ValueError("job name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"job name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}")
    return check_text(name, "job name")
