"""Cron expressions on their own: loading croniter and checking a job's ``cron=`` at decoration.

Below the registry (which checks at decoration) and below ``cron`` (which schedules).
"""

from __future__ import annotations

import inspect
from typing import Any


def load() -> Any:
    """The croniter class; ImportError saying how to install it if it is missing."""
    try:
        # Lazy: croniter is an optional dependency (the "cron" extra).
        from croniter import croniter
    except ImportError:
        raise ImportError("cron=... needs croniter: pip install 'axa-django[cron]'") from None
    return croniter


def installed() -> bool:
    """Whether croniter can be imported."""
    try:
        load()
    except ImportError:
        return False
    return True


def check(name: str, expression: Any, signature: inspect.Signature) -> None:
    """Raise if ``expression`` is not a valid cron expression or the job needs arguments.

    Without croniter only its type is checked: the system check E010 names the missing
    extra, where ``manage.py check`` and every worker's start report it, rather than an
    ImportError out of the import of the jobs module.
    """
    try:
        croniter = load()
    except ImportError:
        croniter = None
    if not isinstance(expression, str) or (croniter is not None and not croniter.is_valid(expression)):
        raise ValueError(
            f"job {name!r}: cron={expression!r} is not a valid cron expression "
            "(5 fields 'minute hour day month weekday', or 6 with seconds as the last field: "
            "'* * * * * */10' is every 10 seconds)"
        )
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"job {name!r} has cron={expression!r} but needs argument(s) {', '.join(required)}; "
            "a periodic job is called without arguments, so give them defaults"
        )
