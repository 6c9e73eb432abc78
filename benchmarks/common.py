"""SQL on Django's default connection, for the benchmark code that runs inside Django."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on Django's default connection and return its rows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def start_workers(count: int, threads: int) -> list[subprocess.Popen[bytes]]:
    """``count`` runworker processes of ``threads`` threads each, on the benchmark settings, output dropped."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return [
        subprocess.Popen(
            [sys.executable, "-m", "django", "runworker", "--concurrency", str(threads)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def wait(condition: Callable[[], bool], timeout: float = 600.0) -> None:
    """Poll ``condition`` until it holds; exit the benchmark if it does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.005)
