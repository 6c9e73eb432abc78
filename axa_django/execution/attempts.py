"""What one in-process attempt did, and the error that carries a job's failure into a test."""

from __future__ import annotations

import contextvars
import inspect
import json
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Outcome(Protocol):
    """What ``execution.Outcome`` offers (this module sits below execution and does not import it)."""

    id: uuid.UUID
    name: str
    attempt: int
    status: str
    error: str | None
    result: str | None


# Set by axa_django.testing.raise_failures(): immediate mode raises JobFailed for a failed job.
RAISE_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("axa_django_raise_inline", default=False)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job run in this process: its status afterwards, its value or its error."""

    id: uuid.UUID
    name: str
    attempt: int
    # "completed", "failed", "cancelled", or "queued" (it failed and will be retried).
    status: str
    # The job's return value (decoded JSON), None unless completed.
    result: Any = None
    # The traceback text recorded on the row, None if completed.
    error: str | None = None
    # What the job raised, when it was the job's own code that raised.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, outcome: Outcome, exception: BaseException | None) -> Attempt:
        """The attempt ``outcome`` records; ``exception`` is kept only if the attempt did not complete."""
        result = json.loads(outcome.result) if outcome.result is not None else None
        failed = outcome.status != "completed"
        return cls(
            outcome.id,
            outcome.name,
            outcome.attempt,
            outcome.status,
            result,
            outcome.error if failed else None,
            exception if failed else None,
        )


class JobFailed(Exception):
    """Jobs run in a test failed; ``exception`` is what the first one raised, also chained as the cause."""

    def __init__(self, failures: Sequence[Attempt], attempts: Sequence[Attempt] = ()) -> None:
        self.failures = list(failures)
        self.attempts = list(attempts) or self.failures
        self.exception = next((a.exception for a in self.failures if a.exception is not None), None)
        lines = [f"{len(self.failures)} job(s) failed:"]
        for a in self.failures:
            state = "will be retried" if a.status == "queued" else a.status
            lines.append(f"\n{a.name} {a.id} (attempt {a.attempt}, {state}):\n{(a.error or '').rstrip()}")
        super().__init__("\n".join(lines))


class Recorder:
    """A job function look-alike for ``execution.perform`` that keeps what its function raised.

    ``perform`` records a failure as text on the row; a test wants the exception itself.
    Every other attribute (signature, attempts, backoff) is the wrapped function's.
    """

    def __init__(self, function: Any) -> None:
        self.function = function
        self.raised: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.function, name)

    def func(self, *args: Any, **kwargs: Any) -> Any:
        """Call the job's function, remembering the exception it raises."""
        self.raised = None
        try:
            value = self.function.func(*args, **kwargs)
        except BaseException as error:
            self.raised = error
            raise
        if inspect.iscoroutine(value):
            return self._watch(value)
        return value

    async def _watch(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await coroutine
        except BaseException as error:
            self.raised = error
            raise
