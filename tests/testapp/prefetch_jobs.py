"""Jobs of the claim-ahead tests: they report how many rows their worker holds."""

import os
import time
from pathlib import Path

from django.db import connection

from axa_django import JobContext, background_job


def _held(worker_id: object) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM axa_queue WHERE status = 'running' AND worker_id = %s AND started_at IS NULL",
            [worker_id],
        )
        return cursor.fetchone()[0]


@background_job(takes_context=True)
def held(context: JobContext, token: str, log: str, seconds: float = 0.0) -> None:
    """Log ``token`` and how many rows its worker holds claimed ahead (started_at not written) when it starts."""
    count = _held(context.worker_id)
    with open(log, "a") as f:
        f.write(f"{token} {count}\n")
    time.sleep(seconds)


@background_job(takes_context=True, max_attempts=2)
def gate(context: JobContext, log: str, path: str) -> None:
    """Log that it started, then wait until ``path`` exists."""
    with open(log, "a") as f:
        f.write(f"gate {context.attempt}\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@background_job(max_attempts=2, backoff=lambda attempt: float("inf"))
def retried_never(fail: bool = True) -> None:
    """Fails; its backoff asks for an infinite wait."""
    if fail:
        raise RuntimeError("fails once")


@background_job(max_attempts=2, backoff=lambda attempt: float("nan"))
def retried_now(log: str) -> None:
    """Fails the first time; its backoff's NaN means no wait."""
    with open(log, "a") as f:
        f.write("run\n")
    if len(Path(log).read_text().splitlines()) < 2:
        raise RuntimeError("fails once")


@background_job(takes_context=True, concurrency=1, concurrency_key=lambda key, **_: key)
def held_per_key(context: JobContext, key: str, token: str, log: str) -> None:
    """As ``held``, one at a time per ``key``; also logs the most rows of one key running (claimed or started)."""
    count = _held(context.worker_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM axa_queue WHERE status = 'running' "
            "AND name = %s GROUP BY concurrency_key) AS per_key",
            [held_per_key.name],
        )
        most = cursor.fetchone()[0]
    with open(log, "a") as f:
        f.write(f"{token} {count} {most}\n")
