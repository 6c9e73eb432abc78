"""Jobs of tests/test_exactly_once.py: each writes an Effect row and completes itself in that transaction."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from axa_django import JobContext, background_job
from tests.testapp.models import Effect


@background_job(takes_context=True)
def pay(context: JobContext, token: str = "", inside: float = 0.0, after: float = 0.0) -> str:
    """One Effect and the completion in one transaction; ``inside``/``after`` seconds spent in it and after it."""
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, token=token)
        if inside:
            time.sleep(inside)
        context.complete_in_transaction(result={"token": token, "attempt": context.attempt})
    if after:
        time.sleep(after)
    return "the return value, not stored"


@background_job(takes_context=True)
def pay_then_raise(context: JobContext, token: str = "") -> None:
    """Completes itself, then raises: the row stays completed."""
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, token=token)
        context.complete_in_transaction(result=token)
    raise RuntimeError("raised after completing itself")


@background_job(takes_context=True)
def pay_and_fail(context: JobContext, token: str = "") -> None:
    """Raises inside the block after completing: the Effect and the completion roll back together."""
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, token=token)
        context.complete_in_transaction(result=token)
        raise RuntimeError("failed inside the transaction")


@background_job(takes_context=True)
def pay_when_told(context: JobContext, log: str, token: str = "") -> str:
    """Writes its Effect, says so in ``log``, then waits for a "go" line there before completing itself."""
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id, token=token)
        with open(log, "a") as f:
            f.write(f"written {context.attempt}\n")
        deadline = time.monotonic() + 30
        while "go" not in Path(log).read_text().split() and time.monotonic() < deadline:
            time.sleep(0.02)
        context.complete_in_transaction(result=token)
    return token


@background_job(takes_context=True)
def pay_outside_a_transaction(context: JobContext) -> None:
    context.complete_in_transaction()


@background_job(takes_context=True)
def pay_twice(context: JobContext) -> None:
    with transaction.atomic():
        context.complete_in_transaction(1)
        context.complete_in_transaction(2)


@background_job(takes_context=True)
def pay_with_a_bad_result(context: JobContext) -> None:
    with transaction.atomic():
        Effect.objects.create(job_id=context.job_id)
        context.complete_in_transaction(result={1, 2})


@background_job(takes_context=True)
async def pay_async(context: JobContext, token: str = "") -> Any:
    """An async job completes itself from sync code, through sync_to_async."""

    def write() -> None:
        with transaction.atomic():
            Effect.objects.create(job_id=context.job_id, token=token)
            context.complete_in_transaction(result=token)

    await sync_to_async(write)()
    return None


@background_job(takes_context=True)
async def pay_from_the_loop(context: JobContext) -> None:
    """Calls it straight from async code: refused, saying how to do it."""
    context.complete_in_transaction()
