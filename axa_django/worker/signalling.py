"""SIGTERM and SIGINT: stop at the first, abort at the second."""

from __future__ import annotations

import logging
import queue as queue_module
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

logger = logging.getLogger("axa_django")


class Stoppable(Protocol):
    """What signals stop: a worker's Control, or a reloading worker (reloading.py)."""

    def stop(self) -> None: ...

    def abort(self) -> None: ...


class Signals:
    """Turns SIGTERM/SIGINT into ``stop``, then ``abort``, on a thread of its own."""

    def __init__(self, control: Stoppable) -> None:
        self.control = control
        self._count = 0
        self._queue: queue_module.SimpleQueue[int | None] = queue_module.SimpleQueue()

    @contextmanager
    def installed(self, install: bool) -> Iterator[None]:
        """While inside, SIGTERM and SIGINT stop the worker (only from the main thread, if ``install``)."""
        previous = {}
        if install and threading.current_thread() is threading.main_thread():
            threading.Thread(target=self._loop, name="axa-signals", daemon=True).start()
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if previous:
                self._queue.put(None)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A handler runs between two bytecodes of the main thread, which may be inside one
        # of the Events stop() sets, holding its lock: setting it here would deadlock. A
        # SimpleQueue's put is reentrant, so the signal goes to a thread of its own.
        self._queue.put(signum)

    def _loop(self) -> None:
        while (signum := self._queue.get()) is not None:
            self.handle(signum)

    def handle(self, signum: int) -> None:
        """Stop at the first SIGTERM/SIGINT, abort at the second."""
        self._count += 1
        if self._count == 1:
            logger.info("received %s: finishing jobs in progress (again to abort)", signal.Signals(signum).name)
            self.control.stop()
        else:
            logger.warning("received %s again: giving jobs in progress back to the queue", signal.Signals(signum).name)
            self.control.abort()
