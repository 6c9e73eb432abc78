"""The listener: LISTEN for rows enqueued and jobs cancelled, on a connection of its own."""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
import uuid
from typing import Any

import psycopg

from .. import sql
from ..sql import refused
from .connection import CANCEL_CHANNEL, CHANNEL, RECONNECT_MAX, close, connect
from .control import Control
from .lanes import FULL_SCAN_UNNOTIFIED, Lanes
from .ledger import Ledger
from .options import Options
from .quiet import Quiet

logger = logging.getLogger("axa_django")

# The fleet's look goes back this far past its last one (late commits; see look()).
LOOK_LAG = 1.0


class Listener:
    """Wakes the dispatcher on each notification, lowers the lanes' floors, relays cancels to running jobs.

    ``enabled`` starts as the NOTIFY setting says and turns False for good when
    notifications cannot reach the worker (``poll_instead``): the worker then polls.
    """

    def __init__(
        self, options: Options, worker_id: uuid.UUID, control: Control, ledger: Ledger, lanes: Lanes, quiet: Quiet
    ) -> None:
        self.options, self.control, self.ledger, self.lanes, self.quiet = options, control, ledger, lanes, quiet
        self.enabled = options.notify
        self.listening = threading.Event()  # set once LISTEN has run
        self.probe = f"probe:{worker_id}"  # the payload the start-up probe sends to itself
        self.probe_seen = threading.Event()
        # As the fleet's poller: when it looks next, and the database time it looks back to.
        self._next_look = 0.0
        self._since: datetime.datetime | None = None

    def poll_instead(self) -> None:
        """Notifications do not reach this worker: poll, and walk the lanes in full more often."""
        self.enabled = False
        self.quiet.heard_all = False
        self.lanes.full_scan = FULL_SCAN_UNNOTIFIED

    def look(self, conn: psycopg.Connection[Any]) -> None:
        """As the fleet's poller, every POLL_INTERVAL: wake every worker if rows fell due unannounced.

        Here, not on the dispatcher: a poller whose threads are busy, or that drains after
        SIGTERM, looks all the same (a retry's backoff ending waited for the others' poll).
        """
        options, now = self.options, time.monotonic()
        if not self.quiet.poller:
            self._since = None  # a poller again later looks back a window, not to its last look
            return
        if now < self._next_look:
            return
        self._next_look = now + options.poll_interval
        window = max(options.poll_interval, options.housekeeping_interval) + options.poll_interval
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('statement_timeout', %s, true)", [f"{round(window * 1000)}ms"])
                row = conn.execute(sql.FLEET_PROBE, {"since": self._since, "window": window}).fetchone()
        except psycopg.errors.QueryCanceled as error:  # its own timeout: the connection is fine
            logger.warning("the fleet's look for rows fallen due took too long (%s); trying again", error)
            return
        except refused.OUTAGE:
            raise
        except psycopg.Error as error:
            logger.warning("the fleet's look for rows fallen due failed (%s); trying again", error)
            return
        if row is not None:
            # A second back: a row written by a transaction that began before this look and
            # committed after it has a run_at before the look's now().
            self._since = row[0] - datetime.timedelta(seconds=LOOK_LAG)

    def loop(self) -> None:
        """Listen until the worker stops (shutdown sends a notification to end the wait at once)."""
        conn: psycopg.Connection[Any] | None = None
        control = self.control
        delay = 0.1
        while not control.stopping.is_set() and self.enabled:
            try:
                if conn is None or conn.closed:
                    conn = connect(self.options.using, "listener")
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {CANCEL_CHANNEL}")
                    self.listening.set()
                    self.quiet.heard_all = self.enabled
                    self.quiet.stir()  # anything enqueued while we were deaf
                    control.wake.set()
                    self.lanes.lower(None)  # and rows made ready behind the floors meanwhile
                    delay = 0.1
                for note in conn.notifies(timeout=0.5):
                    if control.stopping.is_set():
                        break
                    if note.payload == self.probe:
                        self.probe_seen.set()
                        continue
                    if note.channel == CANCEL_CHANNEL:
                        with contextlib.suppress(ValueError):  # a payload not ours
                            self.ledger.cancel([uuid.UUID(note.payload)])
                    else:
                        if note.payload:
                            self.lanes.heard(note.payload)  # rows ready behind the claim's floors
                        self.quiet.stir()  # rows enqueued, or slots freed on another worker
                    control.wake.set()
                self.look(conn)
            except refused.OUTAGE as error:
                # Deaf until LISTEN runs again: what only a notification would say (a limit
                # set, the next due row) is asked of the database at every poll meanwhile.
                self.quiet.heard_all = False
                logger.warning("listener lost the database (%s); reconnecting in %.1fs", error, delay)
                close(conn)
                conn = None
                control.stopping.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        if conn is not None and not self.enabled:
            # Given up for polling (a transaction pooler?): leave no LISTEN on a pooled backend.
            with contextlib.suppress(psycopg.Error):
                conn.execute("UNLISTEN *")
        close(conn)
