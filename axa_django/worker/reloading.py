"""``runworker --reload``: restart the worker when its code changes, as ``runserver`` does (development).

Django's autoreloader (``django.utils.autoreload``) watches the files: its reloader
(StatReloader, or Watchman where it runs), its ``file_changed`` signal, its child's
command line and environment flag, and exit code 3 for "start me again". Not its
``run_with_reloader`` as a whole, which ends a process under running jobs: the child's
SIGTERM and a changed file call ``sys.exit`` on the main thread, killing the thread that
runs the worker, and the parent's ``subprocess.run`` SIGKILLs the child on SIGTERM or
Ctrl-C. Each job running then was lost until the lease ran out, and counted a loss.

Here the parent forwards SIGTERM and SIGINT to the child, which runs in a process group
of its own (a terminal's Ctrl-C reaches it once, through the parent); the child stops
the worker as a signal does, its running jobs finishing within the grace period and
the rest given back to the queue, and only then exits (3 after a change). A child that
fails to start (a syntax error in a job's module) is started again once a file changes.
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import signal
import subprocess
import threading
from typing import Any, Protocol

from django.utils import autoreload

from .signalling import Signals

logger = logging.getLogger("axa_django")

# How long running jobs may finish after a change, unless --grace-period says otherwise;
# those still running then go back to the queue and run again under the new code.
RELOAD_GRACE = 5.0
# autoreload's exit code for "start the child again".
RELOAD_CODE = 3
# How often a child looks whether its parent is gone, and a parent waiting for a change looks at the files.
LOOK_SECONDS = 1.0


class Runner(Protocol):
    """A Worker or the per-queue Pools."""

    def run(self) -> int: ...

    def stop(self) -> None: ...

    def abort(self) -> None: ...


def in_child() -> bool:
    """Whether this process is the one that runs the worker (started by the reloading parent)."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


class _Stops:
    """Stops the runner, remembering whether a signal or the parent's end asked it (not a change)."""

    def __init__(self, runner: Runner) -> None:
        self.runner, self.asked = runner, False

    def stop(self) -> None:
        self.asked = True
        self.runner.stop()

    def abort(self) -> None:
        self.asked = True
        self.runner.abort()


def serve(runner: Runner) -> int:
    """In the child: run ``runner`` on a thread while the reloader watches the files on this one.

    A change stops the runner (jobs finish within its grace period, the rest go back to
    the queue) and returns RELOAD_CODE once it has stopped; SIGTERM or SIGINT stop it
    as without --reload (a second one aborts), and so does the parent's end.
    """
    reloader = autoreload.get_reloader()
    stops = _Stops(runner)
    changed: list[str] = []
    ended: dict[str, Any] = {}
    done = threading.Event()

    def main() -> None:
        try:
            ended["code"] = runner.run()
        except BaseException as error:  # noqa: BLE001 - raised again on the main thread
            ended["error"] = error
        finally:
            done.set()
            reloader.stop()

    def on_change(sender: Any, file_path: Any, **kwargs: Any) -> bool:
        if not changed and not stops.asked:
            logger.info("%s changed: restarting the worker once its running jobs finish or go back", file_path)
            runner.stop()
        changed.append(str(file_path))
        return True  # handled: autoreload would exit this process under the running jobs

    def orphaned(parent: int) -> None:
        while not done.wait(LOOK_SECONDS):
            if os.getppid() != parent:
                logger.warning("the reloading process is gone: stopping the worker")
                stops.stop()
                return

    autoreload.file_changed.connect(on_change, dispatch_uid="axa_django.reloading", weak=False)
    thread = threading.Thread(target=main, name="axa-reload-main")
    try:
        with Signals(stops).installed(True):
            thread.start()
            threading.Thread(target=orphaned, args=(os.getppid(),), name="axa-reload-parent", daemon=True).start()
            logger.info("watching for code changes with %s (--reload)", type(reloader).__name__)
            reloader.run(thread)
            thread.join()
    finally:
        autoreload.file_changed.disconnect(dispatch_uid="axa_django.reloading")
    if "error" in ended:
        raise ended["error"]
    return RELOAD_CODE if changed and not stops.asked else int(ended.get("code", 1))


def supervise() -> int:
    """In the parent: run the child, again after each change, forwarding signals; its exit code at the end."""
    args = autoreload.get_child_arguments()
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    signals: queue_module.SimpleQueue[int] = queue_module.SimpleQueue()
    previous = {
        signum: signal.signal(signum, lambda n, _: signals.put(n)) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        while True:
            # A process group of its own: a terminal's Ctrl-C reaches it once, as forwarded from here.
            child = subprocess.Popen(args, env=env, close_fds=False, process_group=0)
            asked = False
            while (code := child.poll()) is None:
                try:
                    signum = signals.get(timeout=0.2)
                except queue_module.Empty:
                    continue
                asked = True
                child.send_signal(signum)
            if asked:
                return 0 if code == RELOAD_CODE else code  # stopped as it was restarting
            if code == 0:
                return code
            if code == RELOAD_CODE:
                continue
            logger.warning("the worker exited with code %d; it starts again once a file changes (Ctrl-C to quit)", code)
            if not _changed(signals):
                return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _changed(signals: queue_module.SimpleQueue[int]) -> bool:
    """Wait until a file this process imported changes (True) or a signal comes (False)."""
    reloader = autoreload.StatReloader()
    before = dict(reloader.snapshot_files())
    while True:
        try:
            signals.get(timeout=LOOK_SECONDS)
            return False
        except queue_module.Empty:
            pass
        if dict(reloader.snapshot_files()) != before:
            return True
