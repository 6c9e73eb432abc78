"""What a test session must undo however it ends: its temporary directory, its subprocesses."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType


def remove_at_exit(path: Path) -> None:
    """Delete ``path`` when the interpreter exits.

    Registered before the embedded server starts, so it runs after the server's own
    atexit cleanup (last in, first out) and finds it stopped.
    """
    atexit.register(shutil.rmtree, path, ignore_errors=True)


# pytest-xdist's nodes: an interrupted controller kills a node still inside a test (after
# 10 s), and the node's fixtures and atexit (its workers, its server) never run. Each node
# gets the SIGTERM too, and ends its own session as the controller does.
_nodes: list[int] = []


def forward_sigterm_to(pid: int) -> None:
    """Send SIGTERM on to ``pid`` when this session gets one."""
    _nodes.append(pid)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # One clean exit is enough; a second SIGTERM must not cut the cleanup short.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for pid in _nodes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt, so pytest tears fixtures down and atexit runs.

    The default action kills the process on the spot, leaving its runworker
    subprocesses, its embedded PostgreSQL and its directory behind.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    ):
        signal.signal(signal.SIGTERM, _interrupt)
