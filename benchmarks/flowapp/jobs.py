"""The flow benchmark's jobs, in an app of their own: installed only for it (BENCH_FLOW=1), so that no other
benchmark's worker has jobs with limits to claim."""

from axa_django import background_job


def _work(i: int, key: str, seconds: float) -> None:
    """Sleeps ``seconds`` and appends "i key start end" to BENCH_FLOW_LOG (one write)."""
    import os
    import time

    start = time.time()
    time.sleep(seconds)
    with open(os.environ["BENCH_FLOW_LOG"], "a") as log:
        log.write(f"{i} {key} {start:.6f} {time.time():.6f}\n")


@background_job
def work(i: int, key: str, seconds: float) -> None:
    """A job of ``seconds`` with no limit (the flow benchmark's baseline)."""
    _work(i, key, seconds)


@background_job(concurrency=1, concurrency_key=lambda i, key, **_: key)
def work_one_per_key(i: int, key: str, seconds: float) -> None:
    """The same job, one at a time per key across the fleet."""
    _work(i, key, seconds)


@background_job(concurrency=3, concurrency_key=lambda i, key, **_: key)
def work_three_per_key(i: int, key: str, seconds: float) -> None:
    """The same job, at most three at a time per key across the fleet."""
    _work(i, key, seconds)
