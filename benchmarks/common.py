"""What both benchmark processes use: SQL on Django's connection, waiting, starting workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on Django's default connection and return its rows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def wait_until(condition: Any, timeout: float, what: str) -> None:
    """Poll ``condition`` until true; exit the benchmark after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: timed out waiting for {what}")
        time.sleep(0.01)


def manage(settings: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``django-admin <args>`` with ``settings``, output discarded."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE=settings)
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
