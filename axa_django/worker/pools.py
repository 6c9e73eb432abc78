"""Per-queue thread pools in one process: ``runworker --queue emails:8 --queue default:4``.

Each queue gets a ``Worker`` of its own (its own threads, claim, heartbeat and
connections), so a flood in one queue never takes another's threads. This process
answers signals for all of them: the first stops every pool (jobs in progress
finish), the second aborts them; a pool that dies stops the others, exit code 1.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from typing import Any

from . import Worker

logger = logging.getLogger("axa_django")

# "emails:8": a queue and its pool size. A name that itself ends in ":<digits>" cannot
# be given this way; name it with a size ("a:1:8").
_SIZED = re.compile(r"^(?P<queue>.+):(?P<size>[0-9]+)$", re.DOTALL)


def split(text: str) -> tuple[str, int | None]:
    """``"emails:8"`` -> ``("emails", 8)``; ``"emails"`` -> ``("emails", None)``."""
    found = _SIZED.match(text)
    if found is None:
        return text, None
    size = int(found.group("size"))
    if size < 1:
        raise ValueError(f"{text!r}: a queue's pool needs at least 1 thread, not {size}")
    return found.group("queue"), size


class Pools:
    """One Worker per queue in this process; ``run()`` returns the process exit code."""

    def __init__(self, sizes: dict[str, int], **options: Any) -> None:
        if not sizes:
            raise ValueError("per-queue pools need at least one queue")
        options["install_signals"] = False
        self.workers = [Worker(concurrency=size, queues=[queue], **options) for queue, size in sizes.items()]
        for worker in self.workers:
            # Asked from the admin to stop one pool's row: the process stops, as on SIGTERM.
            worker.on_stop_request = self.stop
        self._signals = 0
        self._codes: dict[int, int] = {}
        self._errors: list[BaseException] = []

    def _on_signal(self, signum: int, frame: Any) -> None:
        # This thread only joins the pools' threads: it holds none of the locks the
        # workers' stop() takes, so the handler may stop them directly.
        self._signals += 1
        first = self._signals == 1
        logger.log(
            logging.INFO if first else logging.WARNING,
            "received %s%s",
            signal.Signals(signum).name,
            ": finishing jobs in progress (again to abort)" if first else " again: giving jobs in progress back",
        )
        if first:
            self.stop()
        else:
            self.abort()

    def stop(self) -> None:
        """Stop every pool: claim no more, jobs in progress finish."""
        for worker in self.workers:
            worker.stop()

    def abort(self) -> None:
        """Stop every pool now, giving jobs in progress back to the queue."""
        for worker in self.workers:
            worker.abort()

    def _run_one(self, index: int, worker: Worker) -> None:
        try:
            self._codes[index] = worker.run()
        except BaseException as error:  # noqa: BLE001 - re-raised on the main thread
            self._errors.append(error)
            self._codes[index] = 2
        if self._codes[index] and not any(w.control.stopping.is_set() for w in self.workers if w is not worker):
            logger.critical(
                "the pool of queue %s stopped (exit %d); stopping the others", worker.queues, self._codes[index]
            )
            for other in self.workers:
                other.stop()

    def run(self) -> int:
        """Run every pool until all have stopped."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            threads = [
                threading.Thread(target=self._run_one, args=(index, worker), name=f"axa-pool-{worker.queues[0]}")
                for index, worker in enumerate(self.workers)
                if worker.queues
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)  # short waits: signals are handled on this thread
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if self._errors:
            raise self._errors[0]
        return max(self._codes.values(), default=0)
