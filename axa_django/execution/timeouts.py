"""Stopping a sync job's thread at its timeout: JobTimeout raised in it asynchronously.

``Watch`` is one attempt's timer. The job thread runs the job's function through
``call``; the worker's watchdog calls ``fire`` once the deadline passes, which raises
JobTimeout in the job thread (``PyThreadState_SetAsyncExc``) only while that thread is
inside the job's own code: never in the worker's code around it. A thread blocked in
C sees the exception only when it returns to Python; if it has not stopped within the
grace, the watchdog gives the attempt up (``abandon``) and the thread's late outcome
is dropped.

A job run in the caller's thread (immediate mode, ``testing.run_jobs()``) has an
``alarm`` instead of the worker's watchdog: it fires the same way, but nothing is
given up, as the caller waits for its job. A job blocked in C sees its JobTimeout
when it returns, and ``call`` fails the attempt with it if it returned meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..context import JobContext, JobTimeout, timeout_text


def _raise_in(ident: int, exception: type[BaseException] | None) -> None:
    # NULL clears an exception set earlier and not yet raised.
    target = ctypes.py_object(exception) if exception is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), target)


class Watch:
    """The timeout of one attempt, shared by its job thread and the watchdog."""

    def __init__(
        self,
        name: str,
        attempt: int,
        timeout: float,
        claimed_at: datetime.datetime | None = None,
        context: JobContext | None = None,
    ) -> None:
        self.name = name
        self.attempt = attempt
        self.timeout = timeout
        # The clock starts when a thread starts the job (a row may be claimed ahead and wait).
        self.deadline: float | None = None  # time.monotonic()
        self._claimed = (time.monotonic(), claimed_at)  # the claim, on both clocks
        self._context = context
        self.fired_at: float | None = None  # when the deadline was seen passed
        self._raised = False  # whether fire() has run (JobTimeout raised, if the job's code was running)
        self.abandoned = False
        self._settled = False
        # The job thread, once it starts the job's code: the thread, not its ident, which goes
        # to a new thread once this one has ended.
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._inside: int | None = None  # the job thread's ident while it runs the job's code

    @property
    def running(self) -> bool:
        """True while a thread runs the job's code (an async job's code runs elsewhere)."""
        return self._inside is not None

    @property
    def message(self) -> str:
        """What the JobTimeout says."""
        return timeout_text(self.name, self.attempt, self.timeout)

    def fire(self) -> None:
        """The deadline has passed: raise JobTimeout in the job's code, if it is running."""
        with self._lock:
            if self._raised:
                return
            self._raised = True
            if self.fired_at is None:
                self.fired_at = time.monotonic()
            if self._inside is not None:
                _raise_in(self._inside, JobTimeout)

    def expire(self) -> None:
        """The deadline has passed but JobTimeout cannot be raised yet: the attempt fails with it however it ends."""
        with self._lock:
            if self.fired_at is None:
                self.fired_at = time.monotonic()

    def abandon(self) -> bool:
        """Give the attempt up (its thread did not stop); False if its outcome is already in."""
        with self._lock:
            if self._settled:
                return False
            self.abandoned = True
            return True

    def settle(self) -> bool:
        """The job thread has the attempt's outcome; False if the attempt was given up (drop it)."""
        with self._lock:
            if self.abandoned:
                return False
            self._settled = True
            return True

    def enter(self) -> None:
        """The job thread starts the job's code: the attempt's clock starts now."""
        with self._lock:
            self._inside = threading.get_ident()
            self.thread = threading.current_thread()
            if self.deadline is None:
                now = time.monotonic()
                self.deadline = now + self.timeout
                context = self._context
                if context is not None:
                    context.timeout = self.timeout
                    context._deadline_monotonic = self.deadline
                    monotonic_claim, claimed_at = self._claimed
                    if claimed_at is not None:  # the database's clock at the claim, carried on
                        context.deadline = claimed_at + datetime.timedelta(seconds=now - monotonic_claim + self.timeout)

    def leave(self) -> bool:
        """The job's code has returned or raised; True if it timed out meanwhile."""
        with self._lock:
            ident, self._inside = self._inside, None
            if self.fired_at is not None and ident is not None:
                _raise_in(ident, None)  # fired just as the job returned: not raised yet, and now never
            return self.fired_at is not None


def call(watch: Watch | None, func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)``, stopped with JobTimeout if ``watch`` fires meanwhile."""
    if watch is None:
        return func(*args, **kwargs)
    watch.enter()
    try:
        value = func(*args, **kwargs)
    except JobTimeout as error:
        watch.leave()
        if error.args:
            raise
        # Raised from a class (the C API cannot pass an instance): say what happened, keep where.
        raise JobTimeout(watch.message).with_traceback(error.__traceback__) from None
    except BaseException as error:
        if watch.leave():  # the job turned our JobTimeout into something else
            raise JobTimeout(watch.message) from error
        raise
    if watch.leave():  # the job caught JobTimeout and returned anyway
        raise JobTimeout(watch.message)
    return value


def attempt_timeout(row_timeout: Any, function: Any, backend: str | None) -> float | None:
    """Seconds an attempt may run: the row's timeout, else its job's own; None for none."""
    if isinstance(row_timeout, int | float) and not isinstance(row_timeout, bool) and 0 < row_timeout < math.inf:
        return float(row_timeout)
    # None, or a value only a hand-written row can hold (NaN, negative): the job's own.
    options = getattr(function, "options", None) if backend is None else None
    timeout = getattr(options, "timeout", None)
    return float(timeout) if timeout else None


# How long an alarm past its deadline waits for a database call of the job to end
# before it cancels the call (and then between looks).
PATIENCE = 0.05


@contextlib.contextmanager
def alarm(
    watch: Watch | None,
    locks: Callable[[], list[threading.Lock]] = list,
    interrupt: Callable[[], None] = lambda: None,
) -> Iterator[None]:
    """While the block runs, fire ``watch`` at its deadline from a thread of its own.

    The caller's connections outlive the job, so JobTimeout must not land inside a
    database call (psycopg left mid-statement, then Django closes the connection or
    aborts the caller's transaction when the job's ``atomic`` exits). It is raised
    only while the alarm holds ``locks`` (the connections' own locks, which every
    call on the wire takes), so it lands between calls, never inside one; a call
    still running after PATIENCE is stopped with ``interrupt`` (a cancel).
    """
    if watch is None:
        yield
        return
    done = threading.Event()

    def fire() -> None:
        watch.expire()  # whatever the job ends with from now on, it timed out
        interrupted = False
        while not done.is_set():
            if not watch.running:  # an async job (its task is cancelled), or its code has returned
                watch.fire()
                return
            held = []
            try:
                for lock in locks():
                    if not lock.acquire(timeout=PATIENCE):
                        break
                    held.append(lock)
                else:
                    watch.fire()
                    return
            finally:
                for lock in held:
                    lock.release()
            if not interrupted:
                interrupt()
                interrupted = True

    def ring() -> None:
        while True:
            deadline = watch.deadline  # None until the job's code starts
            left = watch.timeout if deadline is None else deadline - time.monotonic()
            if deadline is not None and left <= 0:
                fire()
                return
            if done.wait(left):
                return

    thread = threading.Thread(target=ring, name=f"axa-alarm-{watch.name}"[:60], daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
