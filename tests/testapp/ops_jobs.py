"""Jobs of the ops tests."""

import time

from axa_django import background_job


@background_job(name="ops.noop")
def noop(n: int = 0) -> int:
    return n


@background_job(name="ops.sleep")
def nap(seconds: float) -> None:
    time.sleep(seconds)  # on purpose: a job that is still running when the test looks


@background_job(name="ops.boom")
def boom() -> None:
    raise RuntimeError("boom on purpose")


@background_job(name="ops.fleet")
def fleet(ms: float = 1.0) -> None:
    time.sleep(ms / 1000)  # on purpose: a job of about ``ms`` milliseconds


@background_job(name="ops.fleet_slow", max_attempts=3)
def fleet_slow(ms: float = 50.0) -> None:
    time.sleep(ms / 1000)  # on purpose: still running when the link is cut
