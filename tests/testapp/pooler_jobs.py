"""Jobs for the pooler tests."""

from django.db import connection

from axa_django import background_job


@background_job
def pooled_record(token: str, log: str) -> int:
    """Query through the job thread's own Django connection, then append token to a file."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with open(log, "a") as f:
        f.write(token + "\n")
    return int(pid)


@background_job(concurrency=2, concurrency_key=lambda token, **_: token[-1])
def limited_record(token: str, log: str) -> None:
    """Append token to a file; at most two at once per last digit of the token (ten keys)."""
    with open(log, "a") as f:
        f.write(token + "\n")
