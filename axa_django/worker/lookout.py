"""The look behind the lanes' floors, on the heartbeat's thread and connection, never the dispatcher's.

Every ``FULL_SCAN`` seconds one claim used to walk every lane from its start, to find
rows that appeared behind the floors (worker/lanes.py). While a snapshot is held that
walk reads every dead entry the snapshot keeps (0.2-0.4 s after minutes at 1,000
jobs/s), and the dispatcher claimed nothing meanwhile: the held soak's p99. The look
reads the same entries without locking anything, on another connection, and only tells
the dispatcher where to walk from; the claims keep walking from their floors meanwhile.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from .. import sql
from .lanes import FULL_SCAN, Lanes, literal
from .options import Options
from .pacing import Pace

logger = logging.getLogger("axa_django")
# Seconds since the epoch of 0001-01-01 and 10000-01-01 UTC: the times Python can hold.
YEAR_1, YEAR_10000 = -62135596800.0, 253402300800.0


class Lookout:
    """Looks behind the floors the lanes show, at most every ``FULL_SCAN`` seconds, when asked."""

    def __init__(
        self, options: Options, lanes: Lanes, interval: float, rouse: Callable[[], None] | None = None
    ) -> None:
        # ``rouse``: tells an idle dispatcher that rows wait behind its floors; nothing else
        # announces them (rows passed over while a user's transaction held them, say).
        self.options, self.lanes, self.rouse = options, lanes, rouse
        # A look covers the floors until the next one is due, with one missed look to spare.
        self.valid = 2 * max(FULL_SCAN, interval)
        self._interval = interval
        self._pace = Pace(FULL_SCAN, first=0.0)
        self._statements: dict[tuple[tuple[str, ...], tuple[int, ...]], str] = {}

    def due(self) -> bool:
        """Whether a look is due: the lanes show floors, notifications reach the worker, the time has come."""
        # Without notifications the claims walk in full every FULL_SCAN_UNNOTIFIED
        # seconds anyway, more often than a heartbeat could look.
        return (
            any(floor is not None for floor in self.lanes.shown[2])
            and self.lanes.full_scan >= FULL_SCAN
            and self._pace.due()
        )

    def look(self, conn: psycopg.Connection[Any], timeout: str) -> None:
        """Look once, in a transaction of its own on ``conn`` under ``timeout`` (statement_timeout); tell the lanes."""
        started = time.monotonic()
        self._pace.ran(started, 0.0)  # a look that fails waits FULL_SCAN too
        names, lanes, floors = self.lanes.shown
        key = (names, lanes)
        statement = self._statements.get(key)
        if statement is None:
            options = self.options
            statement = sql.compose(sql.LOOK_BEHIND, list(names), options.backends, options.queues, lanes=key[1])
            self._statements = {key: statement}  # the lanes change rarely: keep the latest
        with conn.transaction(), conn.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [timeout])
            cursor.execute(statement, {"floors": literal(floors)})
            row = cursor.fetchone()
        # A slow look (a held snapshot's dead entries) is spaced out, and covers the floors
        # until the next, with one missed look to spare (a failed look is tried again a
        # FULL_SCAN later): the claims do not walk in full on its behalf, nor trust their
        # floors more than LONGEST and a look past it (review: twice the gap, 20 minutes).
        self._pace.ran(started, time.monotonic() - started)
        self.valid = self._pace.gap() + max(FULL_SCAN, self._interval)
        seconds = row[0] if row else None
        when = None
        if seconds is not None:
            if not YEAR_1 <= seconds < YEAR_10000:  # '-infinity', a date BC: a walk in full claims it
                self.lanes.lower(None)
            else:
                when = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
            logger.debug("ready rows behind the lanes' floors, from %s: the claims walk from there", when or seconds)
        self.lanes.looked(when, started, self.valid)
        if seconds is not None and self.rouse is not None:
            self.rouse()
