from django.tasks import task


@task
def noop() -> None:
    """Does nothing: the benchmarks measure the queue, not the task."""
