"""Jobs for the testing12 tests: what axa_django.testing runs in-process."""

from django.contrib.auth.models import User
from django.db import connection

from axa_django import background_job


@background_job
def greet(username: str, punctuation: str = "!") -> str:
    """Reads a row the test wrote (uncommitted inside a TestCase)."""
    user = User.objects.get(username=username)
    return f"hello {user.username}{punctuation}"


@background_job
def relay(steps: int) -> int:
    """Enqueues itself with one step less until it reaches 0."""
    if steps > 0:
        relay.perform_later(steps - 1)
    return steps


@background_job
def forever() -> None:
    forever.perform_later()


@background_job
def explode(message: str) -> None:
    raise ValueError(message)


@background_job
async def async_explode(message: str) -> None:
    raise KeyError(message)


@background_job(max_attempts=2, backoff=3600)
def patient(message: str) -> None:
    """Fails with an hour's backoff before its second attempt."""
    raise RuntimeError(message)


@background_job
def bad_sql() -> None:
    """A failing statement: inside a TestCase it aborts the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


@background_job(queue="reports", priority=7)
def report(day: str) -> str:
    return day


@background_job
def tag(values: list, flag: bool = False) -> list:
    return values
