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


# Names croniter takes for the days of the week (0 and 7 are both Sunday).
_DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_DAY_NAMES = {name[:3].lower(): i for i, name in enumerate(_DAYS)}
_ALIASES = {
    "@yearly": "yearly on 1 January at 00:00",
    "@annually": "yearly on 1 January at 00:00",
    "@monthly": "monthly on day 1 at 00:00",
    "@weekly": "Sundays at 00:00",
    "@daily": "daily at 00:00",
    "@midnight": "daily at 00:00",
    "@hourly": "hourly at :00",
}
_WEEKDAYS = {"1-5", "mon-fri"}
_WEEKENDS = {"0,6", "6,0", "6,7", "6-7", "sat,sun", "sun,sat", "sat-sun"}


def _number(field: str, low: int, high: int) -> int | None:
    """The field's value when it is one number within ``low``..``high``."""
    return int(field) if field.isdigit() and low <= int(field) <= high else None


def _every(field: str, period: int) -> int | None:
    """N for ``*/N`` when N divides ``period`` (so the steps are even across its wrap), else None."""
    if field.startswith("*/") and field[2:].isdigit():
        step = int(field[2:])
        if 0 < step <= period and period % step == 0:
            return step
    return None


def _day(field: str) -> int | None:
    """One day of the week, by number (0-7) or name."""
    if field in _DAY_NAMES:
        return _DAY_NAMES[field]
    number = _number(field, 0, 7)
    return None if number is None else number % 7


def describe(expression: str) -> str:
    """A cron expression in words for its common forms ("every 15 minutes", "weekdays at 09:00"); else as written.

    Read as croniter reads it: five fields (minute hour day month weekday), or six with
    seconds as the sixth.
    """
    fields = expression.lower().split()
    if len(fields) == 1 and fields[0] in _ALIASES:
        return _ALIASES[fields[0]]
    if len(fields) == 6:
        if fields[:5] == ["*"] * 5:
            if fields[5] == "*":
                return "every second"
            step = _every(fields[5], 60)
            if step is not None:
                return "every second" if step == 1 else f"every {step} seconds"
        if _number(fields[5], 0, 0) is None:
            return expression
        fields = fields[:5]  # at second 0: as the five fields say
    if len(fields) != 5 or fields[3] != "*":
        return expression
    minute, hour, day, _, weekday = fields
    anyday = day == "*" and weekday == "*"
    if hour == "*" and anyday:
        if minute == "*":
            return "every minute"
        step = _every(minute, 60)
        if step is not None:
            return "every minute" if step == 1 else f"every {step} minutes"
    at_minute = _number(minute, 0, 59)
    if at_minute is None:
        return expression
    if anyday and hour == "*":
        return f"hourly at :{at_minute:02d}"
    hours = _every(hour, 24)
    if anyday and hours is not None:
        return f"hourly at :{at_minute:02d}" if hours == 1 else f"every {hours} hours at :{at_minute:02d}"
    at_hour = _number(hour, 0, 23)
    if at_hour is None:
        return expression
    at = f"{at_hour:02d}:{at_minute:02d}"
    if day == "*":
        if weekday == "*":
            return f"daily at {at}"
        if weekday in _WEEKDAYS:
            return f"weekdays at {at}"
        if weekday in _WEEKENDS:
            return f"weekends at {at}"
        one = _day(weekday)
        return f"{_DAYS[one]}s at {at}" if one is not None else expression
    on = _number(day, 1, 31)
    if on is not None and weekday == "*":
        return f"monthly on day {on} at {at}"
    return expression
