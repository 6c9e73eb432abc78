"""The finisher: writes outcomes in batches on a connection of its own, retrying through outages."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue as queue_module
import time
import uuid
from typing import Any

import psycopg

from .. import sql
from ..exceptions import UnstorableOutcome, stored_type
from ..execution import Outcome, finish, finish_in_place, storable
from ..sql import refused
from .connection import COALESCE, RECONNECT_MAX, close, connect
from .control import Control
from .ledger import UNWRITTEN_MOST, Ledger
from .limited import LimitedClaims
from .listener import Listener
from .options import Options
from .quiet import Quiet

logger = logging.getLogger("axa_django")

# Outcomes written by one statement at most. A batch is what arrived by then (COALESCE
# after the first), so it grows only under load: there, 2,000 instead of 500 drained
# 30,000 no-op jobs 11% faster (benchmarks/results/pg15-finish-batch-ab.txt). The job
# threads now wait at UNWRITTEN_MOST outcomes: half of it lets them run on while a batch
# is written (at the whole of it, 7% slower drains).
BATCH = UNWRITTEN_MOST // 2
# Jobs named in the warning about outcomes not written.
REFUSED_NAMED = 20


class Finisher:
    """Takes outcomes off the ledger and writes them; a refused outcome is written as a failure saying why."""

    def __init__(
        self,
        options: Options,
        worker_id: uuid.UUID,
        control: Control,
        ledger: Ledger,
        limited: LimitedClaims,
        listener: Listener,
        quiet: Quiet,
    ) -> None:
        self.options, self.worker_id, self.control, self.ledger = options, worker_id, control, ledger
        self.limited, self.listener, self.quiet = limited, listener, quiet

    def stop(self) -> None:
        """End the loop once the outcomes handed over before are written."""
        self.ledger.outcomes.put(None)

    def loop(self) -> None:
        """Write outcomes until ``stop``."""
        conn: psycopg.Connection[Any] | None = None
        with contextlib.suppress(psycopg.OperationalError):
            conn = connect(self.options.using, "finisher")  # now, so the first outcome does not wait for it
        outcomes = self.ledger.outcomes
        done = False
        while not done:
            first = outcomes.get()
            if first is None:
                break
            batch = [first]
            gather_until = time.monotonic() + COALESCE
            while len(batch) < BATCH:
                try:
                    # Outcomes of jobs claimed together arrive together: a moment's
                    # wait lets one statement write them all.
                    item = outcomes.get(timeout=max(0.0, gather_until - time.monotonic()))
                except queue_module.Empty:
                    break
                if item is None:
                    done = True
                    break
                batch.append(item)
            conn, unwritten = self.write(conn, batch)
            limited = self._wake_limited(conn, batch)
            refused = [outcome for outcome in batch if outcome.id in unwritten] if unwritten else []
            if refused and not self.control.aborting.is_set():
                # One line per batch: a worker cut off past its lease has a batch's worth refused.
                named = ", ".join(f"{outcome.name} {outcome.id}" for outcome in refused[:REFUSED_NAMED])
                more = len(refused) - REFUSED_NAMED
                logger.warning(
                    "%d outcome(s) not written: their jobs were rescued or changed meanwhile: %s%s",
                    len(refused),
                    named,
                    f" (and {more} more)" if more > 0 else "",
                )
            self.ledger.written(
                [outcome.id for outcome in batch], [o.id for o in refused if o.lost is not None] if refused else ()
            )
            # The dispatcher claims again only if the written outcomes can have changed what
            # it may claim: a retry queued again (at once, it sends no NOTIFY), a limited job's
            # slot freed; or it waits for them (a burst worker's end, a shutdown). Roused
            # after every batch, an idle worker paid one claim and one look for the next due
            # row per job in vain.
            retried = _retries(batch)
            if retried:
                self.quiet.stir()  # news for an idle dispatcher (dispatcher.py): a row to claim again
            if limited or retried or self.options.burst or self.control.stopping.is_set():
                self.control.rouse()
        close(conn)

    def write(
        self, conn: psycopg.Connection[Any] | None, batch: list[Outcome]
    ) -> tuple[psycopg.Connection[Any] | None, set[uuid.UUID]]:
        """Write a batch of outcomes, through outages; return the ids not written (rescued or changed meanwhile,
        or the worker aborting). An outcome the database refuses is written as a failure."""
        delay = 0.1
        while True:
            try:
                if conn is None or conn.closed:
                    conn = connect(self.options.using, "finisher")
                try:
                    with conn.cursor() as cursor:
                        return conn, finish(cursor, batch, self.worker_id, only_lost=True)
                except refused.OUTAGE:
                    raise
                except psycopg.Error as error:
                    if len(batch) > 1:  # find the one the database refuses; write the others as they are
                        unwritten: set[uuid.UUID] = set()
                        for outcome in batch:
                            conn, ids = self.write(conn, [outcome])
                            unwritten |= ids
                        return conn, unwritten
                    return conn, self._alone(conn, batch[0], error)
            except refused.OUTAGE as error:
                if self.control.aborting.is_set():
                    return conn, {outcome.id for outcome in batch}
                logger.warning("cannot write %d outcome(s) (%s); retrying in %.1fs", len(batch), error, delay)
                close(conn)
                conn = None
                self.control.aborting.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    def _alone(self, conn: psycopg.Connection[Any], outcome: Outcome, error: psycopg.Error) -> set[uuid.UUID]:
        """Write one outcome the database refused: stripped to what can be stored, then in place
        (its move into the history refused: a user's foreign key or trigger); the ids not written.

        Never raises for the row: a row that cannot be written at all is logged and left
        running under this worker, which the rescue gives back once the worker stops.
        An attempt lost to the database is written as an attempt spent (``spent``).
        """
        why = refused.reason(error)
        plain, stripped = spent(outcome), unstorable(outcome, error)

        def in_place(written: Outcome) -> Any:
            def attempt(cursor: psycopg.Cursor[Any]) -> set[uuid.UUID]:
                status = finish_in_place(cursor, written, self.worker_id, why)
                if status is None:
                    return {outcome.id}
                if outcome.lost is not None:  # a copy (``spent``): a retry whose cancel was asked ended cancelled
                    written.status = status
                return set()

            return attempt

        attempts = (
            (stripped, lambda cursor: finish(cursor, [stripped], self.worker_id)),
            (plain, in_place(plain)),
            (stripped, in_place(stripped)),
        )
        for written, attempt in attempts:
            try:
                with conn.cursor() as cursor:
                    unwritten = attempt(cursor)
            except refused.OUTAGE:
                raise
            except psycopg.Error as again:
                why = refused.reason(again)
                continue
            if outcome.lost is not None and not unwritten:
                outcome.status = written.status  # what its job thread, waiting for it, reports
            if attempt is not attempts[0][1]:
                logger.error(
                    "the outcome of job %s %s could not move into the history (%s); it was written in place, "
                    "in axa_queue",
                    outcome.name,
                    outcome.id,
                    why,
                )
            return unwritten
        logger.error(
            "the outcome of job %s %s could not be written (%s); the job stays running until this worker stops, "
            "then runs again",
            outcome.name,
            outcome.id,
            why,
        )
        self.ledger.unwritable(outcome.id)
        return {outcome.id}

    def _wake_limited(self, conn: psycopg.Connection[Any] | None, batch: list[Outcome]) -> bool:
        """Rows with a concurrency limit, or of a queue with a fleet-wide limit, finished: their slots are free,
        so wake idle workers (every host).

        Not while this worker has a backlog: its own next claim comes at once, and a
        NOTIFY per finished batch would have every idle worker of the fleet claim in vain.
        Returns whether the batch held such rows.
        """
        frees = any(outcome.frees_queue_slot for outcome in batch)
        if not frees and not self.limited.concurrency_limited([outcome.name for outcome in batch]):
            return False
        self.quiet.stir()  # our own next claim may take the slots
        if conn is None or conn.closed or not self.listener.enabled:
            return True
        if self.ledger.backlog and not self.control.stopping.is_set():
            return True
        try:
            conn.execute(sql.WAKE)
        except psycopg.Error as error:
            logger.warning("could not wake workers after limited jobs finished (%s)", error)
        return True


def _retries(batch: list[Outcome]) -> bool:
    return any(outcome.status == "queued" for outcome in batch)


def spent(outcome: Outcome) -> Outcome:
    """An attempt lost to the database as an attempt spent, for the writes that count no losses: queued again
    only if the job had attempts left, else failed (its loss dropped, it could have run for ever)."""
    if outcome.lost is None:
        return outcome
    status = "queued" if outcome.attempts_left else "failed"
    return dataclasses.replace(outcome, status=status, lost=None)


def unstorable(outcome: Outcome, error: psycopg.Error) -> Outcome:
    """``outcome`` stripped to what can always be stored, saying why the rest was not (never a loss: ``spent``)."""
    outcome = spent(outcome)
    reason = storable(f"{type(error).__name__}: {error}")
    text = f"the outcome of this attempt ({outcome.status}) could not be stored: {reason}"
    entry = json.dumps(
        {
            "attempt": outcome.attempt,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "type": stored_type(UnstorableOutcome),
            "message": text,
            "traceback": "",
        }
    )
    status = "failed" if outcome.status == "completed" else outcome.status
    return Outcome(outcome.id, outcome.name, outcome.attempt, status, error=text, entry=entry, delay=outcome.delay)
