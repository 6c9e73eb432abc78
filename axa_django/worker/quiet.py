"""Which kinds of claim came back empty lately, so that the dispatcher skips them for a while; and how
long an idle worker may wait without a word.
"""

from __future__ import annotations

import time
from typing import Any

# A claim of one kind (concurrency-limited, rate-limited, fleet-limited queues, plain)
# that came back empty is not tried again for this long while the worker claims other
# kinds back to back, unless something may have changed: the worker went idle, a NOTIFY
# came (rows enqueued, slots freed elsewhere), one of its limited jobs finished, or a
# rate token fell due. Each try is a round trip: tried before every claim, a project
# with one limited job paid it on every claim of all the others (a 1-process no-op
# drain: 10,000 -> 6,200 jobs/s), and a backlog of limited jobs paid an empty plain
# claim on every claim. So a scheduled job falling due while the worker drains another
# kind waits up to this long.
QUIET_RECHECK = 1.0


class Quiet:
    """Kinds of claim that came back empty, and a count of stirs (anything may have changed)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}  # kind -> time.monotonic() its last claim came back empty
        self.stirs = 0  # how often stir ran, so that a claim can tell it was stirred meanwhile
        self.news = 0  # how often rows were announced from outside the claims (see stir)
        # Whether every change that makes rows claimable is announced here (the worker hears
        # NOTIFY); False once it polls: then only a claim can tell.
        self.heard_all = True
        self.token_due: float | None = None  # time.monotonic() of the next rate token of a held-back pair
        # Whether this worker polls for the fleet (the eldest worker live within its lease,
        # sql.POLLER, asked by each beat): None until a beat said, or when it takes no part
        # (no notifications, --burst); then True (it looks for the fleet) or False (another does).
        self.poller: bool | None = None

    def idle_wait(self, poll_interval: float, long_wait: float) -> float:
        """The longest an idle worker waits for news before it claims again.

        An idle poll is a round trip that wakes a backend: one a second from each of 32
        idle workers cost the server 1.6% of a core, most of it in that wake. So while
        every change is announced to this worker and one worker polls for the fleet (it
        looks for rows that fell due unannounced every ``poll_interval`` and wakes everyone
        when it sees some: this worker, or another), it claims again after ``long_wait``
        (its housekeeping interval) without news; otherwise after ``poll_interval``.
        """
        if self.poller is not None and self.heard_all:
            return max(poll_interval, long_wait)
        return poll_interval

    def any(self) -> bool:
        """Whether some kind is being skipped."""
        return bool(self._since)

    def due(self, kind: str) -> bool:
        """Whether a claim of ``kind`` should be tried now."""
        quiet = self._since.get(kind)
        if quiet is None:
            return True
        now = time.monotonic()
        token = kind == "rate" and self.token_due is not None and now >= self.token_due
        return token or now - quiet >= QUIET_RECHECK

    def note(self, kind: str, rows: list[tuple[Any, ...]], stirs: int) -> list[tuple[Any, ...]]:
        """Note whether a claim of ``kind`` begun at ``stirs`` came back empty; return its rows."""
        if rows or stirs != self.stirs:  # stirred while it claimed: what it saw may be old
            self._since.pop(kind, None)
        else:
            self._since[kind] = time.monotonic()
        return rows

    def stir(self, news: bool = True) -> None:
        """Something may have made rows of any kind claimable: try every kind at the next claim (any thread).

        ``news``: announced from outside the claims (a NOTIFY, a retry written, a limited
        job's slot freed); False for the dispatcher's own stir when a claim finds nothing.
        """
        self.stirs += 1
        if news:
            self.news += 1
        self._since.clear()

    def token_wait(self, seconds: float) -> float:
        """``seconds``, or less if a held-back rate-limited job gets its next start sooner."""
        due = self.token_due
        return seconds if due is None else max(0.0, min(seconds, due - time.monotonic()))
