"""The AXA_DJANGO setting: merged over defaults, validated when first read, cached until it changes."""

from __future__ import annotations

import difflib
import zoneinfo
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import connections
from django.dispatch import receiver

SETTING = "AXA_DJANGO"

DEFAULTS: dict[str, Any] = {
    # "queue" writes a row for a worker; "immediate" runs the job inside perform_later.
    "MODE": "queue",
    # Alias in DATABASES that holds the queue table.
    "DATABASE": "default",
    # Seconds an idle worker waits between polls when no notification arrives.
    "POLL_INTERVAL": 1.0,
    # A running row claimed without a worker id (the seed's CLAIM) is rescued after this.
    "STALE_MINUTES": 60,
    # A worker whose heartbeat is older than this is dead and its jobs are rescued.
    "LEASE_SECONDS": 30.0,
    # Attempts a job gets unless its decorator or the call says otherwise.
    "MAX_ATTEMPTS": 1,
    # Times a job's worker may die under it (SIGKILL, OOM, lost lease) before the job
    # fails; losses are counted apart from attempts.
    "MAX_LOSSES": 3,
    # Largest encoded args object accepted at enqueue, in bytes.
    "MAX_ARGS_BYTES": 1_000_000,
    # LISTEN/NOTIFY wake-ups; turn off behind PgBouncer in transaction mode.
    "NOTIFY": True,
    # The database is reached through a transaction pooler (PgBouncer pool_mode =
    # transaction): workers use no prepared statements and no LISTEN, and poll.
    "TRANSACTION_POOLING": False,
    # Finished jobs older than this many seconds are pruned by workers (None: never).
    "RETENTION": None,
    # Time zone of cron schedules (None: settings.TIME_ZONE).
    "CRON_TIMEZONE": None,
    # The metrics view and the dashboard's JSON answer anyone (True), or only staff with
    # view permission on jobs and, for the metrics view, a scraper sending this bearer token.
    "METRICS_PUBLIC": False,
    "METRICS_TOKEN": None,
    # Job names enqueued here that another service runs (a Rust worker), and queues that
    # workers serve though no job here declares them: no UnknownJobWarning or
    # UnknownQueueWarning at enqueue, under any warnings filter (pytest's "error" too).
    "KNOWN_JOBS": (),
    "KNOWN_QUEUES": (),
}

MODES = ("queue", "immediate")


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _names(value: Any) -> bool:
    # Not a str: a bare "reports" would read as the queues 'r', 'e', 'p', ...
    return isinstance(value, list | tuple | set | frozenset) and all(
        isinstance(name, str) and name.strip() == name != "" and name.isprintable() for name in value
    )


# key -> (predicate, what the value must be)
RULES: dict[str, tuple[Any, str]] = {
    "POLL_INTERVAL": (_positive_number, "a positive number of seconds"),
    "STALE_MINUTES": (_positive_int, "a positive whole number of minutes"),
    "LEASE_SECONDS": (_positive_number, "a positive number of seconds"),
    "MAX_ATTEMPTS": (_positive_int, "a positive whole number"),
    # FINISH and RESCUE read it as a PostgreSQL int, and count a loss past it.
    "MAX_LOSSES": (lambda v: _positive_int(v) and v < 2**31 - 1, "a positive whole number below 2147483647"),
    "MAX_ARGS_BYTES": (_positive_int, "a positive whole number of bytes"),
    "NOTIFY": (lambda v: isinstance(v, bool), "True or False"),
    "TRANSACTION_POOLING": (lambda v: isinstance(v, bool), "True or False"),
    "RETENTION": (lambda v: v is None or _positive_number(v), "None or a positive number of seconds"),
    "CRON_TIMEZONE": (lambda v: v is None or isinstance(v, str), "None or a time zone name"),
    "METRICS_PUBLIC": (lambda v: isinstance(v, bool), "True or False"),
    "METRICS_TOKEN": (
        lambda v: v is None or (isinstance(v, str) and len(v) >= 16 and v.isprintable() and v == v.strip()),
        "None or a string of at least 16 printable characters without spaces around it",
    ),
    "KNOWN_JOBS": (_names, "a list of job names, such as ['RustMailer'] (printable, no spaces around them)"),
    "KNOWN_QUEUES": (_names, "a list of queue names, such as ['bulk'] (printable, no spaces around them)"),
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting, with the id of the system check that reports it."""

    id: str
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        hint = f" {self.hint}" if self.hint else ""
        return f"{self.message}{hint} ({self.id})"


def _unknown_key(key: Any) -> Problem:
    known = sorted(DEFAULTS)
    close = difflib.get_close_matches(key.upper(), known, n=1) if isinstance(key, str) else []
    guess = f"Did you mean {close[0]!r}? " if close else ""
    return Problem(
        "axa_django.E002", f"AXA_DJANGO has an unknown key {key!r}.", guess + "Known keys: " + ", ".join(known) + "."
    )


def problems(user: Any) -> list[Problem]:
    """What is wrong with ``user`` as an AXA_DJANGO setting (E001-E005, E007), in check order."""
    if not isinstance(user, dict):
        return [
            Problem(
                "axa_django.E001",
                f"AXA_DJANGO must be a dict, not {type(user).__name__}.",
                'Write it as AXA_DJANGO = {"MODE": "queue"}.',
            )
        ]
    found = [_unknown_key(key) for key in sorted(set(user) - set(DEFAULTS), key=repr)]
    if "MODE" in user and user["MODE"] not in MODES:
        found.append(
            Problem(
                "axa_django.E003",
                f"AXA_DJANGO['MODE'] is {user['MODE']!r}; it must be 'queue' or 'immediate'.",
                "Use 'queue' in production and 'immediate' to run jobs inline in tests.",
            )
        )
    for key, (valid, wanted) in RULES.items():
        if key in user and not valid(user[key]):
            found.append(Problem("axa_django.E004", f"AXA_DJANGO[{key!r}] is {user[key]!r}; it must be {wanted}."))
    alias = user.get("DATABASE", DEFAULTS["DATABASE"])
    if not isinstance(alias, str) or alias not in django_settings.DATABASES:
        found.append(
            Problem(
                "axa_django.E005",
                f"AXA_DJANGO['DATABASE'] is {alias!r}, which is not in DATABASES.",
                "Name an alias from DATABASES, or leave DATABASE out to use 'default'.",
            )
        )
    tz = user.get("CRON_TIMEZONE")
    if isinstance(tz, str):
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            found.append(
                Problem(
                    "axa_django.E007",
                    f"AXA_DJANGO['CRON_TIMEZONE'] is {tz!r}, which is not a known time zone.",
                    "Use an IANA name such as 'Europe/Paris' or 'UTC'.",
                )
            )
    return found


def other_vendor(alias: str) -> str | None:
    """The vendor of DATABASES[alias] when it exists and is not PostgreSQL, else None (no query)."""
    if alias in django_settings.DATABASES and connections[alias].vendor != "postgresql":
        return connections[alias].vendor
    return None


def vendor_problem(alias: str) -> Problem | None:
    """E006 when the queue database ``alias`` is not PostgreSQL, else None (no query)."""
    vendor = other_vendor(alias)
    if vendor is None:
        return None
    return Problem(
        "axa_django.E006",
        f"The queue database {alias!r} uses {vendor}, not PostgreSQL.",
        f"axa_django needs PostgreSQL (SKIP LOCKED, LISTEN/NOTIFY, jsonb): point DATABASES[{alias!r}] (or "
        "AXA_DJANGO['DATABASE']) at a PostgreSQL database.",
    )


def user_setting() -> Any:
    """AXA_DJANGO as written in settings ({} when absent), unvalidated."""
    return getattr(django_settings, SETTING, {})


def alias_as_written() -> str:
    """The queue database alias as written ('default' when unset), without validating: for system checks."""
    user = user_setting()
    alias = user.get("DATABASE", DEFAULTS["DATABASE"]) if isinstance(user, dict) else DEFAULTS["DATABASE"]
    return alias if isinstance(alias, str) else DEFAULTS["DATABASE"]


@cache
def get_settings() -> dict[str, Any]:
    """Return AXA_DJANGO merged over DEFAULTS; raise ImproperlyConfigured if it is malformed."""
    user = user_setting()
    found = problems(user)
    if found:
        lines = "\n".join(f"  - {problem}" for problem in found)
        raise ImproperlyConfigured(f"settings.AXA_DJANGO is invalid; fix it in your settings module:\n{lines}")
    return {**DEFAULTS, **user}


def get(key: str) -> Any:
    """Return one merged setting."""
    return get_settings()[key]


# Aliases already seen to be PostgreSQL; the vendor of an alias does not change.
_postgres: set[str] = set()


def queue_database() -> str:
    """Return the queue database alias; raise ImproperlyConfigured (E006) unless it is PostgreSQL."""
    alias: str = get("DATABASE")
    if alias not in _postgres:
        problem = vendor_problem(alias)
        if problem is not None:
            raise ImproperlyConfigured(str(problem))
        _postgres.add(alias)
    return alias


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING, "TIME_ZONE", "DATABASES"):
        get_settings.cache_clear()
        _postgres.clear()
