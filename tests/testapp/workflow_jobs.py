"""Jobs of the workflow tests."""

import time
from typing import Any

from axa_django import JobContext, background_job


def _mark(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


@background_job
def step(token: str, log: str, fail: bool = False, seconds: float = 0.0) -> str:
    """Log start and end of ``token``; fail (permanently) when told."""
    _mark(log, f"start {token}")
    if seconds:
        time.sleep(seconds)
    if fail:
        raise RuntimeError(f"{token} told to fail")
    _mark(log, f"end {token}")
    return token


@background_job(max_attempts=1)
def fail_once(token: str, log: str) -> str:
    """Fail on the first run of ``token`` (no retry), succeed on a later one."""
    with open(log, "a+") as f:
        f.seek(0)
        seen = f.read().splitlines().count(f"start {token}")
        f.write(f"start {token}\n")
    if seen == 0:
        raise RuntimeError(f"{token} fails the first time")
    _mark(log, f"end {token}")
    return token


@background_job
def noop(i: int = 0) -> int:
    return i


@background_job(takes_context=True)
def gather(context: JobContext, log: str) -> list[Any]:
    """Log the parents' results, in order."""
    results = list(context.parent_results().values())
    _mark(log, f"gather {results!r}")
    return results


@background_job
def batch_report(batch_id: str, counts: dict[str, int]) -> dict[str, Any]:
    return {"report": batch_id, "counts": counts}


@background_job
def batch_alert(batch_id: str, counts: dict[str, int]) -> dict[str, Any]:
    return {"alert": batch_id, "counts": counts}


@background_job
def until(at: float, token: str = "") -> str:
    """Sleep until the wall-clock time ``at``, so that jobs on several workers end together."""
    time.sleep(max(0.0, at - time.time()))
    return token


@background_job
def fan_in(log: str) -> None:
    _mark(log, "fan-in")


@background_job(unique=lambda i: f"k{1 / i}")
def keyed(i: int) -> int:
    """A job with a unique key (whose key function raises for 0)."""
    return i
