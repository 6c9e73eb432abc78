from axa_django import background_job


@background_job
def noop() -> None:
    """Does nothing: the benchmarks measure the queue, not the job."""
