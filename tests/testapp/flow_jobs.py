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


def interval(log: str | None, name: str, key: str, token: str, seconds: float) -> str:
    """Record this run's start and end (wall clock), for overlap checks across processes."""
    start = time.time()
    nap(seconds)
    mark(log, f"{name} {key} {token} {start:.6f} {time.time():.6f}")
    return token


@background_job(concurrency=1, concurrency_key=lambda account_id, **_: f"acct:{account_id}")
def one_per_account(account_id: int, token: str = "", log: str | None = None, seconds: float = 0.005) -> str:
    return interval(log, "one", f"acct:{account_id}", token, seconds)


@background_job(concurrency=3, concurrency_key=lambda account_id, **_: f"acct:{account_id}")
def three_per_account(account_id: int, token: str = "", log: str | None = None, seconds: float = 0.005) -> str:
    return interval(log, "three", f"acct:{account_id}", token, seconds)


@background_job(concurrency=2)
def two_at_once(token: str = "", log: str | None = None, seconds: float = 0.005) -> str:
    """No key: one cap for all of the job's rows."""
    return interval(log, "two", "", token, seconds)


@background_job
def unlimited(token: str = "", log: str | None = None, seconds: float = 0.005) -> str:
    return interval(log, "unlimited", "", token, seconds)


@background_job(concurrency=1, concurrency_key=lambda path, **_: "one")
def wait_for_file(path: str, log: str | None = None) -> str:
    """Runs until ``path`` exists (a slot held for as long as the test wants)."""
    mark(log, f"waiting {os.getpid()}")
    while not os.path.exists(path):
        time.sleep(0.01)
    return "seen"


@background_job(rate="5/s", rate_key=lambda api, **_: api)
def five_per_second(api: str, token: str = "", log: str | None = None) -> str:
    """Records its start (wall clock) per api key."""
    mark(log, f"{api} {token} {time.time():.6f}")
    return token


@background_job(rate="2/m")
def two_per_minute(token: str = "") -> str:
    return token


@background_job(concurrency=1, concurrency_key=lambda account, **_: account)
def per_account(account: str, gate: str = "", log: str | None = None) -> str:
    """One at a time per ``account``; runs until the file ``gate`` exists (a slot held as long as the test wants)."""
    start = time.time()
    deadline = time.monotonic() + 60  # a test that never opens the gate must not hold a worker for ever
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    mark(log, f"per {account} {account} {start:.6f} {time.time():.6f}")
    return account
