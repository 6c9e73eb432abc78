"""System checks for the AXA_DJANGO setting and the queue database."""

from __future__ import annotations

from typing import Any

import psycopg
from django.core import checks
from django.db import DatabaseError

from . import conf
from .ops import budget

# Kept importable from here for callers written before the rules moved to conf.
MODES = conf.MODES
other_vendor = conf.other_vendor


def messages(user: Any) -> list[checks.CheckMessage]:
    """The system check errors for ``user`` as an AXA_DJANGO setting (the same rules conf raises on)."""
    found = conf.problems(user)
    if isinstance(user, dict):
        alias = user.get("DATABASE", conf.DEFAULTS["DATABASE"])
        if not any(p.id == "axa_django.E005" for p in found) and (problem := conf.vendor_problem(alias)):
            # E006 after E005's place, before E007, as the checks always listed them.
            at = next((i for i, p in enumerate(found) if p.id == "axa_django.E007"), len(found))
            found.insert(at, problem)
    return [checks.Error(p.message, hint=p.hint, id=p.id) for p in found]


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a malformed AXA_DJANGO setting before a worker or view trips on it."""
    return messages(conf.user_setting())


@checks.register(checks.Tags.database)
def check_connection_budget(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (W001) when the live workers' connections plus a margin reach the server's max_connections.

    A database check: ``manage.py check --database default`` (and ``migrate``) run it;
    an unreachable or unmigrated database is left to the checks that report it.
    """
    alias = conf.alias_as_written()
    if not databases or alias not in databases or conf.problems(conf.user_setting()) or conf.vendor_problem(alias):
        return []
    try:
        found = budget.fleet(alias, float(conf.get("LEASE_SECONDS")))
    except (DatabaseError, psycopg.Error):
        return []
    if not found.tight:
        return []
    message, hint = budget.warning_text(found)
    return [checks.Warning(message, hint=hint, id="axa_django.W001")]
