"""A library module nothing imports at start: a worker must not import it for a row."""

from django_tasks import task


@task
def never_at_start() -> str:
    return "ran"
