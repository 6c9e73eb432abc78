"""Jobs of the flow tests."""

from __future__ import annotations

import os
import time

from axa_django import background_job


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
