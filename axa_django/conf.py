"""The AXA_DJANGO setting, merged over defaults and cached until it changes."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
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
}


@cache
def get_settings() -> dict[str, Any]:
    """Return AXA_DJANGO merged over DEFAULTS (unvalidated; see checks.py)."""
    user = getattr(django_settings, SETTING, None)
    merged = dict(DEFAULTS)
    if isinstance(user, dict):
        merged.update(user)
    return merged


def get(key: str) -> Any:
    """Return one merged setting."""
    return get_settings()[key]


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING, "TIME_ZONE"):
        get_settings.cache_clear()
