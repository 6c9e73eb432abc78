"""Flow-control options of a job: checked at decoration, keys computed at enqueue.

``concurrency=N`` caps how many of a job's rows run at once across every worker,
per ``concurrency_key`` (one shared cap for the job when it has no key).
``rate="10/s"`` caps how many start per second (``/m``, ``/h``), per ``rate_key``.
Both are enforced by the database in the claim (sql.py, worker/limited.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .options import check_text

# The key of a job's rows when it has no key function: one cap shared by all of them.
SHARED = ""

_RATE = re.compile(r"^\s*([0-9]+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
MAX_LIMIT = 2**31 - 1
# Keys are index entries and lock names: short, as job names are.
MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``period`` seconds."""

    count: int
    period: float

    @property
    def text(self) -> str:
        """The rate as written, e.g. ``10/s``."""
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}[self.period]
        return f"{self.count}/{unit}"


def parse_rate(rate: object, job: str) -> Rate | None:
    """``"10/s"`` -> Rate(10, 1.0); None stays None; anything else is refused."""
    if rate is None:
        return None
    if not isinstance(rate, str):
        raise TypeError(f"job {job!r}: rate must be a string such as '10/s', '100/m' or '1000/h', not {rate!r}")
    found = _RATE.match(rate)
    if found is None or not 1 <= int(found.group(1)) <= MAX_LIMIT:
        raise ValueError(
            f"job {job!r}: rate {rate!r} does not parse; write starts per second, minute or hour "
            "with at least 1 start, e.g. '10/s', '100/m' or '1000/h'"
        )
    return Rate(int(found.group(1)), _PERIODS[found.group(2)])


def check_concurrency(concurrency: object, job: str) -> int | None:
    """``concurrency`` if it can cap running rows: None or a whole number from 1."""
    if concurrency is None:
        return None
    if type(concurrency) is not int or not 1 <= concurrency <= MAX_LIMIT:
        raise ValueError(
            f"job {job!r}: concurrency must be a whole number of at least 1 (rows running at once), "
            f"not {concurrency!r}; leave it out for no limit"
        )
    return concurrency


def check_key_function(key: object, what: str, needs: str, has_limit: bool, job: str) -> Any:
    """A key function must be callable, and comes with the limit it keys."""
    if key is None:
        return None
    if not callable(key):
        raise TypeError(f"job {job!r}: {what} must be a function of the job's arguments returning a str, not {key!r}")
    if not has_limit:
        raise TypeError(f"job {job!r}: {what} keys a {needs} limit; give {needs}=... as well")
    return key


def compute_key(key: Callable[..., Any], arguments: dict[str, Any], what: str, job: str) -> str:
    """The key ``key`` gives these arguments; a clear error if it raises or is not a usable str."""
    try:
        value = key(**arguments)
    except Exception as error:
        raise ValueError(
            f"job {job!r}: the {what} function raised {type(error).__name__}: {error}; nothing was enqueued"
        ) from error
    if not isinstance(value, str):
        raise TypeError(f"job {job!r}: the {what} function returned {value!r}, not a str; nothing was enqueued")
    if not value:
        raise ValueError(f"job {job!r}: the {what} function returned an empty string; return a non-empty key")
    return check_key(value, what)


def check_key(value: str, what: str) -> str:
    """A key a row can carry: printable, at most MAX_KEY_LENGTH characters."""
    if len(value) > MAX_KEY_LENGTH:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {MAX_KEY_LENGTH}")
    return check_text(value, what.replace("_", " "))
