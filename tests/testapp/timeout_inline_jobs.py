"""Jobs of the timeout tests that run in the caller's thread (immediate mode, run_jobs())."""

from __future__ import annotations

import asyncio
import os
import time

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import connection, transaction

from axa_django import JobContext, JobTimeout, background_job
from tests.testapp.flow_jobs import mark, nap


@background_job(timeout=0.3)
def naps(seconds: float, log: str | None = None) -> str:
    mark(log, "start")
    nap(seconds)
    mark(log, "end")
    return "woke"


@background_job(timeout=0.3, max_attempts=2, backoff=0)
def overruns_once(seconds: float, log: str) -> str:
    """Overruns on its first attempt only (its log does not exist yet then)."""
    first = not os.path.exists(log)
    mark(log, "start")
    nap(seconds if first else 0)
    return "second"


@background_job(timeout=0.3)
async def async_naps(seconds: float, log: str | None = None) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        mark(log, "cancelled")
        raise
    return "woke"


@background_job(timeout=0.3)
def catches(seconds: float, log: str | None = None) -> str:
    try:
        nap(seconds)
    except JobTimeout:
        mark(log, "caught")
    return "ignored the timeout"


@background_job(timeout=0.2)
def blocked_in_c(seconds: float) -> str:
    """time.sleep runs no Python code: a JobTimeout raised meanwhile can only land once it returns."""
    time.sleep(seconds)
    return "returned"


@background_job(timeout=0.3, takes_context=True)
def deadline_of(context: JobContext) -> list[float]:
    assert context.deadline is not None and context.timeout is not None
    return [context.timeout, context.deadline.timestamp()]


def one_query() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


@background_job(timeout=0.1)
def writes(prefix: str, seconds: float) -> None:
    """Writes in atomic blocks of its own until it is stopped: JobTimeout lands in Django's and psycopg's code."""
    count = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with transaction.atomic():
            User.objects.create(username=f"{prefix}{count}")
            count += one_query()


@background_job(timeout=0.1)
async def async_queries(seconds: float, log: str | None = None) -> None:
    """Queries through sync_to_async (back on the caller's thread and connection) until it is cancelled."""
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            await sync_to_async(one_query)()
    except asyncio.CancelledError:
        mark(log, "cancelled")
        raise


@background_job(timeout=0.2)
def sleeps_in_the_database(seconds: float) -> None:
    """One statement that outlasts the timeout: it is cancelled at the deadline."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(%s)", [seconds])
