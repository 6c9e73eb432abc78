from django.tasks import task

from benchmarks.measure import record as write


@task
def noop() -> None:
    """Does nothing: the benchmarks measure the queue, not the task."""


@task
def record(i: int) -> None:
    """Appends its id and times to BENCH_RECORD: the benchmark's drain and pickup runs time these."""
    write(i)
