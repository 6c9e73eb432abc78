"""A worker's claim of jobs in queues with a fleet-wide limit (``manage.py queues limit``).

One ``QueueClaim`` per worker, used by its dispatcher thread only. It runs the two
statements of sqlqueues.py when some queue this worker serves has a limit; which queues
do is read again at most every ``REFRESH`` seconds, so a worker pays nothing while no
queue is limited. The plain claim never takes a limited queue's rows (it reads the
limits in the statement itself), so a limit set a moment ago holds at once; a worker
starts claiming a newly limited queue's rows here within ``REFRESH``: setting a limit
sends a NOTIFY, and a worker that hears them reads the limits again only after news
(``Quiet.news``) or every ``REFRESH_HEARD`` seconds (it was one of an idle worker's
three statements a second).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from .. import sql
from ..sql import queues as sqlqueues

REFRESH = 1.0
REFRESH_HEARD = 60.0


class QueueClaim:
    """Claims rows of limited queues for one worker, each queue within its limit across the fleet."""

    def __init__(self, worker_id: Any, names: list[str], backends: list[str], queues: list[str] | None) -> None:
        self.worker_id = worker_id
        self.queues = queues
        self._lock = sql.compose(sqlqueues.QUEUE_LOCK, names, backends, queues)
        self._claim = sql.compose(sqlqueues.QUEUE_CLAIM, names, backends, queues)
        self._empty = not names and not backends
        self._limited = False
        self._read_at = -REFRESH
        self._read_news: int | None = None

    def wanted(self, conn: psycopg.Connection[Any], news: int | None = None) -> bool:
        """Whether a queue this worker serves has a limit: asked of the database at most every REFRESH s, and
        with ``news`` (``Quiet.news``, None for a worker that does not hear NOTIFY) only once it changed or every
        REFRESH_HEARD s."""
        if self._empty:
            return False
        now = time.monotonic()
        every = REFRESH if news is None or news != self._read_news else REFRESH_HEARD
        if now - self._read_at >= every:
            limited = {row[0] for row in conn.execute(sqlqueues.LIMITED_QUEUES).fetchall()}
            self._limited = bool(limited if self.queues is None else limited & set(self.queues))
            self._read_at, self._read_news = now, news
        return self._limited

    def claim(self, conn: psycopg.Connection[Any], limit: int, news: int | None = None) -> list[tuple[Any, ...]] | None:
        """Claim up to ``limit`` rows of limited queues for free threads, in one round trip; None if not tried."""
        if limit < 1 or not self.wanted(conn, news):
            return None
        # One pipeline up to its Sync is one implicit transaction: the lock, then the claim
        # in a new snapshot, then COMMIT, which lets the queues' locks go.
        with conn.pipeline():
            conn.execute(self._lock)
            claimed = conn.execute(self._claim, {"worker": self.worker_id, "limit": limit, "ahead": False})
        return claimed.fetchall()
