"""Jobs of the flow tests."""

from __future__ import annotations

import asyncio
import os
import time

from axa_django import JobContext, JobTimeout, background_job


def mark(path: str | None, text: str) -> None:
    """Append a line to ``path`` (one write, so lines of concurrent jobs never mix)."""
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")


@background_job(queue="flow-emails")
def email(token: str, log: str | None = None) -> str:
    mark(log, f"email {token} {os.getpid()}")
    return token


@background_job(queue="flow-default")
def chore(token: str, log: str | None = None, seconds: float = 0.0) -> str:
    mark(log, f"start {token} {time.time()}")
    time.sleep(seconds)
    mark(log, f"end {token} {time.time()}")
    return token


def nap(seconds: float) -> None:
    """Sleep in short steps: an exception raised in this thread lands between them."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


@background_job(timeout=0.5, max_attempts=2, backoff=0)
def sleepy(seconds: float, log: str | None = None) -> str:
    mark(log, "sleepy start")
    nap(seconds)
    mark(log, "sleepy end")
    return "woke"


@background_job(timeout=0.5)
def stubborn(log: str | None = None) -> str:
    """Catches JobTimeout and carries on: the attempt fails anyway."""
    try:
        nap(30)
    except JobTimeout:
        mark(log, "caught")
    return "ignored the timeout"


@background_job(timeout=0.3)
def blocked(path: str) -> str:
    """Blocks in C (a FIFO's open waits for a writer), where JobTimeout cannot land."""
    try:
        with open(path) as fifo:
            return fifo.read()
    finally:
        mark(path + ".log", "returned")


@background_job(timeout=0.5, takes_context=True)
def deadline_of(context: JobContext) -> list[float]:
    """Reports the deadline it was given, in seconds after its start."""
    assert context.deadline is not None
    return [context.timeout or 0.0, context.deadline.timestamp()]


@background_job(timeout=0.3)
async def async_sleepy(seconds: float, log: str | None = None) -> str:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        mark(log, "async cancelled")
        raise
    return "woke"


@background_job
def untimed(seconds: float) -> str:
    nap(seconds)
    return "done"
