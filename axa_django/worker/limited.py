"""The claims of jobs with a concurrency or rate limit, each (name, key) pair within its limit."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import psycopg

from .. import registry, sql
from ..sql import flow as sqlflow
from .connection import DispatcherConnection
from .options import Options
from .quiet import Quiet

logger = logging.getLogger("axa_django")

# How often rows of limited jobs written without a key are looked for: each look walks
# the queued rows of those jobs, so not at every housekeeping.
ADOPT_SECONDS = 60.0
# How often a fold of the per-pair counts reads every delta, not only those of
# transactions since the last fold (see _fold_since).
FULL_FOLD_SECONDS = 60.0
# How many keys of a name a claim may walk past for each pair it wants: pairs other
# workers hold, or whose rows wait for their run_at or sit in a paused queue, are passed
# over up to this many times the want (pairs with no slot free are not walked at all).
REACH = 8


class LimitedClaims:
    """Claims rows of this worker's limited jobs on the dispatcher's connection; owns where each walk resumes."""

    def __init__(self, options: Options, worker_id: uuid.UUID, db: DispatcherConnection, quiet: Quiet) -> None:
        self.options, self.worker_id, self.db, self.quiet = options, worker_id, db, quiet
        # Where the next walk over limited pairs starts (round robin), per kind of limit.
        self._pair_start: dict[str, str] = {}
        # The xmin of the last fold of the per-pair counts (sqlflow.FOLD): the next reads
        # deltas from there on; from the start ('0') on a new connection and once a
        # minute, in case a fold that skipped deltas another was folding outlived it.
        self._fold_since = "0"
        self._next_full_fold = 0.0
        self._flow_sql: dict[str, tuple[str, str]] = {}  # kind -> (pair walk, claim), composed once
        self._limits: dict[str, int] | None = None
        self._steps: dict[str, float] = {}

    def keyed(self, names: list[str]) -> tuple[dict[str, int], dict[str, float]]:
        """Of ``names``, those with a concurrency limit (-> limit) and with a rate limit (-> seconds per start)."""
        if self._limits is None:
            functions = {name: registry.get(name) for name in names}
            self._limits = {n: f.concurrency for n, f in functions.items() if f is not None and f.concurrency}
            self._steps = {n: f.rate.period / f.rate.count for n, f in functions.items() if f is not None and f.rate}
        return self._limits, self._steps

    def limited_names(self, names: list[str]) -> set[str]:
        """Names claimed apart from the plain CLAIM: those with a concurrency or a rate limit."""
        limits, steps = self.keyed(names)
        return set(limits) | set(steps)

    def concurrency_limited(self, names: list[str]) -> bool:
        """Whether any of ``names`` (of jobs that finished) has a concurrency limit."""
        return bool(self._limits) and any(name in self._limits for name in names)

    def claim(self, names: list[str], limit: int, free: int, ahead: bool) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` rows of jobs with limits, each (name, key) pair within its limit.

        Rows with a concurrency limit may be claimed ahead (``ahead``: beyond the ``free``
        threads), rows with a rate limit only for free threads.
        """
        limits, steps = self.keyed(names)
        rows: list[tuple[Any, ...]] = []
        quiet = self.quiet
        stirs = quiet.stirs
        if limits and quiet.due("concurrency"):
            rows += quiet.note("concurrency", self.claim_pairs("concurrency", limits, limit, ahead), stirs)
        if steps and len(rows) < min(limit, free) and quiet.due("rate"):
            more = self.claim_pairs("rate", steps, min(limit, free) - len(rows), False)
            rows += quiet.note("rate", more, stirs)
        return rows

    def claim_pairs(self, kind: str, caps: dict[str, Any], limit: int, ahead: bool) -> list[tuple[Any, ...]]:
        """One claim of ``kind`` (concurrency or rate) in one round trip: fold the counts, walk the pairs, claim."""
        conn = self.db.current()
        if limit < 1 or conn is None:
            return []
        rate = kind == "rate"
        pairs_sql, claim_sql = self.statements(kind, caps)
        params = {"worker": self.worker_id, "limit": limit, "ahead": ahead}
        try:
            # The walk, the claim (and the rate's next token) in one pipeline: one round
            # trip, and one transaction, since the statements of a pipeline up to its Sync
            # run in one (the extended protocol's implicit transaction; no BEGIN or COMMIT
            # to send: measured 2.3 -> 1.3 ms a claim). The claim reads what the walk
            # locked from axa.picked or axa.pairs, transaction-local settings.
            fold = None
            with conn.pipeline() as pipeline:
                if not rate:
                    # The per-pair counts the walk goes by, brought up to date in a
                    # transaction of their own (the Sync ends it), in the same round trip.
                    now = time.monotonic()
                    if now >= self._next_full_fold:
                        self._fold_since, self._next_full_fold = "0", now + FULL_FOLD_SECONDS
                    conn.execute(sqlflow.FOLD_LOCK, {"since": self._fold_since})
                    fold = conn.execute(sqlflow.FOLD, {"since": self._fold_since})
                    pipeline.sync()
                # A rate claim locks its pairs (then takes one row of each whose token is
                # due), a concurrency claim the rows themselves.
                want = max(4, limit) if rate else limit
                walk = {"start": self._pair_start.get(kind, ""), "limit": want, "reach": REACH * max(4, limit)}
                found = conn.execute(pairs_sql, walk)
                claimed = conn.execute(claim_sql, params)
                wait = conn.execute(sqlflow.RATE_WAIT) if rate else None
            if fold is not None:
                self._fold_since = (fold.fetchone() or ("0",))[0]
            last = found.fetchone()
            rows = claimed.fetchall()
            self._pair_start[kind] = last[1] if last and last[1] is not None else ""
            if wait is not None:
                seconds = (wait.fetchone() or (None,))[0]
                self.quiet.token_due = None if seconds is None else time.monotonic() + float(seconds)
            return rows
        except psycopg.Error as error:
            self._fold_since = "0"
            self.db.failed(f"jobs with {kind} limits", error)
            return []

    def statements(self, kind: str, caps: dict[str, Any]) -> tuple[str, str]:
        """The pair walk and the claim of ``kind``, composed once with this worker's limited names."""
        if kind not in self._flow_sql:
            limited = sorted(caps)
            rate = kind == "rate"
            pairs = sqlflow.RATED_PAIRS if rate else sqlflow.LIMITED_PICK
            claim = sqlflow.CLAIM_RATED if rate else sqlflow.CLAIM_LIMITED
            # Limits and steps are numbers, written in before compose writes names in.
            kind_of = "float8" if rate else "int"
            numbers = f"ARRAY[{', '.join(repr(caps[n]) for n in limited)}]::{kind_of}[]"
            pairs, claim = pairs.replace("{caps}", numbers), claim.replace("{caps}", numbers)
            self._flow_sql[kind] = (
                sql.compose(pairs, limited, [], self.options.queues, limited),
                sql.compose(claim, limited, [], self.options.queues, limited),
            )
        return self._flow_sql[kind]

    def adopt_unkeyed(self, names: list[str]) -> None:
        """Give rows of limited jobs written without a key (by SQL, the seed, another service) the shared key.

        The limited claims walk keyed rows only, and the plain claim leaves limited names
        alone: unkeyed rows would otherwise wait forever. Also drops the per-pair counts
        down to nothing (sqlflow.DROP_IDLE), left there by the folds.
        """
        limits, steps = self.keyed(names)
        if limits:
            self.db.bounded(sqlflow.DROP_IDLE, {})
        for column, limited in (("concurrency_key", sorted(limits)), ("rate_key", sorted(steps))):
            if limited:
                rows = self.db.bounded(sqlflow.ADOPT_UNKEYED.format(column=column), {"names": limited})
                if rows:
                    logger.info("gave %d row(s) of limited jobs without a %s the job's shared key", len(rows), column)
