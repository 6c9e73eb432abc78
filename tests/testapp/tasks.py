"""Tasks for the backend tests, defined as a library does (django.tasks on Django >= 6.0, the
django-tasks backport on 5.2); workers import them by path."""

import asyncio
import os
import threading
import time
from pathlib import Path

from tests.tasks_api import TaskContext, task


def _mark(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


@task
def add(a: int, b: int = 0) -> int:
    return a + b


@task(queue_name="emails", priority=5)
def send(token: str, log: str) -> str:
    _mark(log, token)
    return token


@task
def record(token: str, log: str) -> str:
    """Append token to a file so tests can count runs across processes."""
    _mark(log, f"{token} {os.getpid()}")
    return token


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task
def wait_for_file(path: str, timeout: float = 60) -> str:
    """Run until ``path`` exists, so a test can see the task running."""
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)
    return "released"


@task(takes_context=True)
def with_context(context: TaskContext) -> dict:
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "status": result.status, "workers": result.worker_ids}


@task(backend="retrying", takes_context=True)
def flaky(context: TaskContext, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on``."""
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
async def async_add(a: int, b: int) -> dict:
    await asyncio.sleep(0)
    return {"sum": a + b, "thread": threading.current_thread().name}


@task
def returns_tuple() -> tuple:
    return (1, "two")


@task
def returns_set() -> set:
    return {1, 2}


@task(backend="dummy")
def not_ours() -> str:
    return "must not run"


def plain(path: str) -> None:
    """Not a task: a worker must never call it."""
    Path(path).write_text("called")


@task
async def async_rendezvous(log: str, token: str, peers: int) -> str:
    """Waits on its own event loop until ``peers`` tasks are running at once."""
    _mark(log, token)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while len(Path(log).read_text().split()) < peers:
        if loop.time() > deadline:
            raise TimeoutError(f"{token}: the other tasks never started alongside this one")
        await asyncio.sleep(0.01)
    return token


@task
def returns_bytes() -> bytes:
    """Bytes are not JSON: the task fails, as a bytes argument is refused."""
    return b"raw"
