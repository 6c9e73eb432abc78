"""The worker's flow control: the watchdog that stops attempts at their timeout.

``FlowLoops`` is mixed into ``Worker``. A sync job past its deadline gets JobTimeout
raised in its thread (an async one has its task cancelled by ``run_cancellable``). A
thread that has not stopped within the grace (blocked in C) is given up: the attempt
is written as failed with JobTimeout, a new job thread takes its slot, and whatever
the old thread returns later is dropped. A worker left with as many stuck threads as
its concurrency exits 1, so that its process manager starts a clean one.
"""

from __future__ import annotations

import datetime
import logging
import math
import threading
import time
from typing import Any

import psycopg

from . import registry, sql, sqlflow
from .context import JobTimeout
from .execution import Claimed, failure
from .timeouts import Watch

logger = logging.getLogger("axa_django")

# How often the watchdog looks when no deadline is nearer (it also wakes at each claim).
TICK = 0.5
# How often rows of limited jobs written without a key are looked for: each look walks
# the queued rows of those jobs, so not at every housekeeping.
ADOPT_SECONDS = 60.0
# A claim of one kind (concurrency-limited, rate-limited, plain) that came back empty is
# not tried again for this long while the worker claims other kinds back to back, unless
# something may have changed: the worker went idle, a NOTIFY came (rows enqueued, slots
# freed elsewhere), one of its limited jobs finished, or a rate token fell due. Each try
# is a round trip: tried before every claim, a project with one limited job paid it on
# every claim of all the others (a 1-process no-op drain: 10,000 -> 6,200 jobs/s), and a
# backlog of limited jobs paid an empty plain claim on every claim. So a scheduled job
# falling due while the worker drains another kind waits up to this long.
QUIET_RECHECK = 1.0
# How often a fold of the per-pair counts reads every delta, not only those of
# transactions since the last fold (see _fold_since).
FULL_FOLD_SECONDS = 60.0
# How many keys of a name a claim may walk past for each pair it wants: pairs other
# workers hold, or whose rows wait for their run_at or sit in a paused queue, are passed
# over up to this many times the want (pairs with no slot free are not walked at all).
REACH = 8


class FlowLoops:
    """The watchdog of ``Worker`` (a mixin: the attributes are the worker's)."""

    def _init_flow(self, timeout_grace: float) -> None:
        if not (isinstance(timeout_grace, int | float) and not isinstance(timeout_grace, bool) and timeout_grace >= 0):
            raise ValueError(f"timeout_grace must be a number of seconds >= 0, not {timeout_grace!r}")
        self.timeout_grace = float(timeout_grace)
        self._stuck: set[int | None] = set()
        self._replacements = 0
        self._watchdog_wake = threading.Event()
        # Where the next walk over limited pairs starts (round robin), per kind of limit.
        self._pair_start: dict[str, str] = {}
        # The xmin of the last fold of the per-pair counts (sqlflow.FOLD): the next reads
        # deltas from there on; from the start ('0') on a new connection and once a
        # minute, in case a fold that skipped deltas another was folding outlived it.
        self._fold_since = "0"
        self._next_full_fold = 0.0
        self._flow_sql: dict[str, tuple[str, str]] = {}  # kind -> (pair walk, claim), composed once
        self._quiet: dict[str, float] = {}  # kind -> time.monotonic() its last claim came back empty
        self._stirs = 0  # how often _stir ran, so that a claim can tell it was stirred meanwhile
        # Whether the dispatcher's last claim filled its room: it then claims again as soon
        # as a thread frees, so a slot its finished jobs free is taken without waking others.
        self._backlog = False
        self._limits: dict[str, int] | None = None
        self._steps: dict[str, float] = {}
        self._token_due: float | None = None
        self._next_adopt = 0.0  # time.monotonic() of the next rate token of a held-back pair

    # -- concurrency and rate limits ------------------------------------------------

    def _keyed(self, names: list[str]) -> tuple[dict[str, int], dict[str, float]]:
        """This worker's names with a concurrency limit (-> limit) and with a rate limit (-> seconds per start)."""
        if self._limits is None:
            functions = {name: registry.get(name) for name in names}
            self._limits = {n: f.concurrency for n, f in functions.items() if f is not None and f.concurrency}
            self._steps = {n: f.rate.period / f.rate.count for n, f in functions.items() if f is not None and f.rate}
        return self._limits, self._steps

    def _limited_names(self, names: list[str]) -> set[str]:
        """Names claimed apart from the plain CLAIM: those with a concurrency or a rate limit."""
        limits, steps = self._keyed(names)
        return set(limits) | set(steps)

    def _claim_limited(self, names: list[str], limit: int, free: int, ahead: bool) -> list[tuple[Any, ...]]:
        """Claim up to ``limit`` rows of jobs with limits, each (name, key) pair within its limit.

        Rows with a concurrency limit may be claimed ahead (``ahead``: beyond the ``free``
        threads), rows with a rate limit only for free threads.
        """
        limits, steps = self._keyed(names)
        rows: list[tuple[Any, ...]] = []
        stirs = self._stirs
        if limits and self._due("concurrency"):
            rows += self._quieted("concurrency", self._claim_pairs("concurrency", limits, limit, ahead), stirs)
        if steps and len(rows) < min(limit, free) and self._due("rate"):
            more = self._claim_pairs("rate", steps, min(limit, free) - len(rows), False)
            rows += self._quieted("rate", more, stirs)
        return rows

    def _due(self, kind: str) -> bool:
        quiet = self._quiet.get(kind)
        if quiet is None:
            return True
        now = time.monotonic()
        token = kind == "rate" and self._token_due is not None and now >= self._token_due
        return token or now - quiet >= QUIET_RECHECK

    def _quieted(self, kind: str, rows: list[tuple[Any, ...]], stirs: int) -> list[tuple[Any, ...]]:
        if rows or stirs != self._stirs:  # stirred while it claimed: what it saw may be old
            self._quiet.pop(kind, None)
        else:
            self._quiet[kind] = time.monotonic()
        return rows

    def _stir(self) -> None:
        """Something may have made rows of any kind claimable: try every kind at the next claim (any thread)."""
        self._stirs += 1
        self._quiet.clear()

    def _claim_pairs(self, kind: str, caps: dict[str, Any], limit: int, ahead: bool) -> list[tuple[Any, ...]]:
        conn = self._conn
        if limit < 1 or conn is None or conn.closed:
            return []
        rate = kind == "rate"
        pairs_sql, claim_sql = self._flow_statements(kind, caps)
        params = {"worker": self.id, "limit": limit, "ahead": ahead}
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
                self._token_due = None if seconds is None else time.monotonic() + float(seconds)
            return rows
        except psycopg.Error as error:
            self._fold_since = "0"
            self._claim_failed(f"jobs with {kind} limits", conn, error)
            return []

    def _flow_statements(self, kind: str, caps: dict[str, Any]) -> tuple[str, str]:
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
                sql.compose(pairs, limited, [], self.queues, limited),
                sql.compose(claim, limited, [], self.queues, limited),
            )
        return self._flow_sql[kind]

    def _adopt_unkeyed(self, names: list[str]) -> None:
        """Give rows of limited jobs written without a key (by SQL, the seed, another service) the shared key.

        The limited claims walk keyed rows only, and the plain claim leaves limited names
        alone: unkeyed rows would otherwise wait forever. Also drops the per-pair counts
        down to nothing (sqlflow.DROP_IDLE), left there by the folds.
        """
        limits, steps = self._keyed(names)
        if limits:
            self._execute(sqlflow.DROP_IDLE, {}, bounded=True)
        for column, limited in (("concurrency_key", sorted(limits)), ("rate_key", sorted(steps))):
            if limited:
                rows = self._execute(sqlflow.ADOPT_UNKEYED.format(column=column), {"names": limited}, bounded=True)
                if rows:
                    logger.info("gave %d row(s) of limited jobs without a %s the job's shared key", len(rows), column)

    def _token_wait(self, seconds: float) -> float:
        """``seconds``, or less if a held-back rate-limited job gets its next start sooner."""
        due = self._token_due
        return seconds if due is None else max(0.0, min(seconds, due - time.monotonic()))

    def _wake_limited(self, conn: psycopg.Connection[Any] | None, batch: list[Any]) -> None:
        """Rows with a concurrency limit finished: their slots are free, so wake idle workers (every host).

        Not while this worker has a backlog: its own next claim comes at once, and a
        NOTIFY per finished batch would have every idle worker of the fleet claim in vain.
        """
        if not self._limits or not any(outcome.name in self._limits for outcome in batch):
            return
        self._stir()  # our own next claim may take the slots
        if conn is None or conn.closed or not self.notify:
            return
        if self._backlog and not self._stopping.is_set():
            return
        try:
            conn.execute(sql.WAKE)
        except psycopg.Error as error:
            logger.warning("could not wake workers after limited jobs finished (%s)", error)

    def _watch(self, job: Claimed, function: Any, timeout: float | None, claimed_at: Any) -> None:
        """Give a just-claimed attempt its timer: the row's timeout, else its job's."""
        if not (isinstance(timeout, float) and 0 < timeout < math.inf):
            # None, or a value only a hand-written row can hold (NaN, negative): the job's own.
            timeout = function.options.timeout if job.backend is None and function is not None else None
        if not timeout:
            return
        claimed = claimed_at if isinstance(claimed_at, datetime.datetime) else None
        job.watch = Watch(job.name, job.attempt, float(timeout), claimed, job.context)
        self._watchdog_wake.set()

    def _watchdog_loop(self) -> None:
        while not self._done.is_set():
            now = time.monotonic()
            nearest = now + TICK
            with self._lock:
                watched = [job for job in self._in_flight.values() if job.watch is not None]
            for job in watched:
                watch = job.watch
                assert watch is not None
                if watch.deadline is None:
                    continue  # not started yet (claimed ahead): its clock has not started
                if watch.fired_at is None:
                    if now >= watch.deadline:
                        logger.warning("job %s %s: %s", job.name, job.id, watch.message)
                        watch.fire()
                        nearest = min(nearest, now + self.timeout_grace)
                    else:
                        nearest = min(nearest, watch.deadline)
                elif not watch.abandoned:
                    if now >= watch.fired_at + self.timeout_grace:
                        self._give_up(job, watch)
                    else:
                        nearest = min(nearest, watch.fired_at + self.timeout_grace)
            self._watchdog_wake.wait(max(0.01, nearest - time.monotonic()))
            self._watchdog_wake.clear()

    def _give_up(self, job: Claimed, watch: Watch) -> None:
        if not watch.abandon():
            return  # its thread returned just now: its own outcome stands
        error = JobTimeout(
            f"{watch.message}; its thread did not stop within the {self.timeout_grace:g}s grace "
            "(blocked outside Python?), so the attempt was given up"
        )
        outcome = failure(job, registry.get(job.name), error, self.id)
        with self._lock:
            if job.unmarked:  # claimed ahead: the outcome writes when it started
                outcome.started = self._starts.pop(job.id, None) or time.time()
            self._unwritten += 1
            self._in_flight.pop(job.id, None)
            self.processed += 1
            self.outcomes[outcome.status] += 1
            self._stuck.add(watch.thread_ident)
            stuck = len(self._stuck)
        self._outcomes.put(outcome)
        self._wake.set()
        if stuck >= self.concurrency:
            logger.critical(
                "%d job thread(s) are stuck in jobs past their timeout; exiting 1 so that the worker is restarted",
                stuck,
            )
            self._die("stuck job")
            return
        logger.error("job %s %s: its thread is stuck; starting a new job thread in its place", job.name, job.id)
        self._replacements += 1
        self._spawn(self._job_loop, f"axa-job-r{self._replacements}")
