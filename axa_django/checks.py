"""System checks for the AXA_DJANGO setting and the queue database."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from . import conf

MODES = ("queue", "immediate")


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# key -> (predicate, what the value must be)
_RULES: dict[str, tuple[Any, str]] = {
    "POLL_INTERVAL": (_positive_number, "a positive number of seconds"),
    "STALE_MINUTES": (_positive_int, "a positive whole number of minutes"),
    "LEASE_SECONDS": (_positive_number, "a positive number of seconds"),
    "MAX_ATTEMPTS": (_positive_int, "a positive whole number"),
    "MAX_ARGS_BYTES": (_positive_int, "a positive whole number of bytes"),
    "NOTIFY": (lambda v: isinstance(v, bool), "True or False"),
    "TRANSACTION_POOLING": (lambda v: isinstance(v, bool), "True or False"),
    "RETENTION": (lambda v: v is None or _positive_number(v), "None or a positive number of seconds"),
    "CRON_TIMEZONE": (lambda v: v is None or isinstance(v, str), "None or a time zone name"),
}


def other_vendor(alias: str) -> str | None:
    """The vendor of DATABASES[alias] when it exists and is not PostgreSQL, else None (no query)."""
    if alias in settings.DATABASES and connections[alias].vendor != "postgresql":
        return connections[alias].vendor
    return None


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a malformed AXA_DJANGO setting before a worker or view trips on it."""
    user = getattr(settings, conf.SETTING, {})
    if not isinstance(user, dict):
        return [
            checks.Error(
                f"AXA_DJANGO must be a dict, not {type(user).__name__}.",
                hint='Write it as AXA_DJANGO = {"MODE": "queue"}.',
                id="axa_django.E001",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(user) - set(conf.DEFAULTS)):
        errors.append(
            checks.Error(
                f"AXA_DJANGO has an unknown key {key!r}.",
                hint="Known keys: " + ", ".join(sorted(conf.DEFAULTS)) + ".",
                id="axa_django.E002",
            )
        )
    if "MODE" in user and user["MODE"] not in MODES:
        errors.append(
            checks.Error(
                f"AXA_DJANGO['MODE'] is {user['MODE']!r}; it must be 'queue' or 'immediate'.",
                hint="Use 'queue' in production and 'immediate' to run jobs inline in tests.",
                id="axa_django.E003",
            )
        )
    for key, (valid, wanted) in _RULES.items():
        if key in user and not valid(user[key]):
            errors.append(
                checks.Error(
                    f"AXA_DJANGO[{key!r}] is {user[key]!r}; it must be {wanted}.",
                    id="axa_django.E004",
                )
            )
    alias = user.get("DATABASE", conf.DEFAULTS["DATABASE"])
    if alias not in settings.DATABASES:
        errors.append(
            checks.Error(
                f"AXA_DJANGO['DATABASE'] is {alias!r}, which is not in DATABASES.",
                hint="Name an alias from DATABASES, or leave DATABASE out to use 'default'.",
                id="axa_django.E005",
            )
        )
    elif (vendor := other_vendor(alias)) is not None:
        errors.append(
            checks.Error(
                f"The queue database {alias!r} uses {vendor}, not PostgreSQL.",
                hint="axa_django needs PostgreSQL (SKIP LOCKED, LISTEN/NOTIFY, jsonb).",
                id="axa_django.E006",
            )
        )
    tz = user.get("CRON_TIMEZONE")
    if isinstance(tz, str):
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            errors.append(
                checks.Error(
                    f"AXA_DJANGO['CRON_TIMEZONE'] is {tz!r}, which is not a known time zone.",
                    hint="Use an IANA name such as 'Europe/Paris' or 'UTC'.",
                    id="axa_django.E007",
                )
            )
    return errors
