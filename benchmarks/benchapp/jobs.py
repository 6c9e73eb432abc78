from axa_django import background_job
from benchmarks.measure import record as write


@background_job
def noop() -> None:
    """Does nothing: the benchmarks measure the queue, not the job."""


@background_job
def record(i: int) -> None:
    """Appends its id and times to BENCH_RECORD: the benchmark's drain and pickup runs time these."""
    write(i)
