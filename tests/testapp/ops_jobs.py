"""Jobs of the ops tests (two only: runworker lists the first 50 known names, and another test reads that list)."""

import time

from axa_django import background_job


@background_job(name="ops.sleep")
def nap(seconds: float = 0.0) -> float:
    time.sleep(seconds)  # on purpose: a job of a chosen length, still running when a test looks
    return seconds


@background_job(name="ops.boom")
def boom() -> None:
    raise RuntimeError("boom on purpose")
