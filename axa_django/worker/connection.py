"""The worker's connections: how each is opened, and the dispatcher's, which reconnects through outages."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import psycopg
from django.db import connections

from .. import conf, sql
from ..exceptions import CannotConnect, PoolerMisconfigured
from ..execution import dberrors
from ..sql import refused
from .control import Control
from .ledger import Ledger
from .options import Options

logger = logging.getLogger("axa_django")

CHANNEL = "axa_queue"
# Where a cancel of running jobs is announced (models.JobQuerySet.cancel), the job id as payload.
CANCEL_CHANNEL = "axa_cancel"
RECONNECT_MAX = 5.0
COALESCE = 0.0005
# Housekeeping statements (rescue, never-due rows) may not hold the dispatcher longer.
STATEMENT_TIMEOUT = "5s"
LOCK_TIMEOUT = "1s"


def prepare_threshold(using: str) -> int | None:
    options = connections[using].settings_dict.get("OPTIONS", {})
    if conf.get("TRANSACTION_POOLING"):
        return None  # a transaction pooler hands each transaction to any server connection
    # Django leaves server-side prepared statements off by default; the worker repeats
    # a handful of statements thousands of times, so it prepares them unless told not to.
    return options.get("prepare_threshold", 5)


def keepalives(lease: float) -> dict[str, int]:
    """libpq settings that make a silently dead TCP link fail within about one lease."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, round(lease / 3)),
        "keepalives_interval": max(1, round(lease / 10)),
        "keepalives_count": 3,
        # Unacknowledged data (a statement sent into a partition) gives up after a lease.
        "tcp_user_timeout": max(1000, round(lease * 1000)),
        "connect_timeout": max(2, round(lease / 3)),
    }


def connect(using: str, purpose: str) -> psycopg.Connection[Any]:
    """Open an autocommit psycopg connection to the queue database; the session is left as a pooler can reuse it."""
    wrapper = connections[using]
    params = wrapper.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    params["prepare_threshold"] = prepare_threshold(using)
    for key, value in keepalives(float(conf.get("LEASE_SECONDS"))).items():
        params.setdefault(key, value)  # the project's OPTIONS win
    params.setdefault("application_name", f"axa_django {purpose}")
    conn = psycopg.connect(autocommit=True, **params)
    global _opened
    _opened += 1
    if params["prepare_threshold"] is None:
        read_only = conn.execute(f"SELECT {dberrors.READ_ONLY}", prepare=False).fetchone()
    else:
        # With a large history PostgreSQL's choice between plans goes to custom plans,
        # re-planning the claim at every call for the same plan; ours are good generic.
        # A link cut between a statement and its COMMIT leaves the server holding the
        # transaction's row locks until it notices the dead peer (hours), and other
        # workers' rescue waiting on them: our transactions never idle, so the server
        # ends such a session after half a lease. (A transaction pooler owns the
        # session instead: nothing is set there.) A generic plan made while the queue was
        # empty would scan the table for as long as it is cached: our statements all have
        # their index, so a sequential scan is never the plan a worker wants. Nor a bitmap
        # scan: on small tables the planner priced a claim's walk as a bitmap scan of all
        # queued rows plus a sort as cheap as the claim index's ordered walk, and kept it.
        # Nor JIT: a small table's sequential scan, still planned where it has no index,
        # now costs more than jit_above_cost, and compiling took longer than the statement
        # ever runs (on PostgreSQL 15: the rescue 30-95 ms instead of 0.1, the look for
        # unhandled jobs 670-770 ms, each time, on the dispatcher).
        idle = max(100, round(float(conf.get("LEASE_SECONDS")) * 500))
        read_only = conn.execute(
            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
            "set_config('idle_in_transaction_session_timeout', %s, false), "
            "set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false), "
            f"set_config('jit', 'off', false), {dberrors.READ_ONLY}",
            [f"{idle}ms"],
            # Once a connection: prepared (at prepare_threshold 0), its Parse and its run landed in
            # two transactions behind a transaction pooler, and the worker failed before its check
            # for one could say so (review).
            prepare=False,
        ).fetchone()
    if read_only is not None and read_only[-1]:
        # A standby (no target_session_attrs=read-write, or the primary gone): every write,
        # LISTEN included, would fail. Waited out like an outage, never a crash loop.
        host = conn.info.host
        port = conn.info.port
        conn.close()
        raise dberrors.ReadOnlyServer(
            f"the server at {host}:{port} is read-only (a standby, or default_transaction_read_only is on); "
            "waiting for a read-write one: with several hosts, add target_session_attrs=read-write to the "
            "connection's OPTIONS so that a standby is skipped"
        )
    return conn


# Connections opened by this process: a new one may reach a server that lost what this
# worker wrote before (a crash, a failover), so the watchman reconciles after it.
_opened = 0


def opened() -> int:
    """How many worker connections this process has opened."""
    return _opened


def close(conn: psycopg.Connection[Any] | None) -> None:
    """Close ``conn`` if there is one, whatever state it is in."""
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            conn.close()


# A statement or lock timeout: OperationalErrors of a connection that still works.
_CUT_SHORT = (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)
# A statement psycopg holds prepared that the server no longer has, or can no longer run
# ("cached plan must not change result type"): psycopg keeps it, and it failed at every run
# until the connection was replaced. A pipeline cut short at the run psycopg prepares at
# leaves such a name on a direct connection too (review: the limited claims' fold).
_STALE_STATEMENT = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.FeatureNotSupported)


# What to do behind a transaction pooler the worker is not configured for (startup.check_pooler too).
POOLER_ADVICE = (
    "Set AXA_DJANGO['TRANSACTION_POOLING'] = True (no prepared statements, no LISTEN), or connect the "
    "worker to PostgreSQL directly or through a session-mode pool."
)
# Said when a prepared statement vanished from under the dispatcher (``execute``).
POOLER_FOUND_LATE = (
    "database {alias!r}: the dispatcher's prepared statement vanished from its connection ({error}): a "
    "pooler in transaction mode (PgBouncer's pool_mode = transaction) hands each transaction to another "
    "PostgreSQL backend. There claims fail and jobs run twice, so the worker stops. " + POOLER_ADVICE
)


class DispatcherConnection:
    """The dispatcher's connection: opened at start, reopened after an outage, by this part alone."""

    def __init__(self, options: Options, control: Control, ledger: Ledger) -> None:
        self.options, self.control, self.ledger = options, control, ledger
        self._conn: psycopg.Connection[Any] | None = None
        self._failing_since: float | None = None
        # Whether statements failing for over a lease raise (the dispatcher's loop: the worker
        # stops); the stop's own statements are each tried once, logged, never raised.
        self.fail_after_lease = True
        self._lost_at: float | None = None  # when the connection was lost, until another is open
        # Connections opened so far: a new one may reach another server (a crash, a failover)
        # whose rows are not where what was learnt on the old one says (worker/lanes.py).
        self.opened = 0
        # When a prepared statement last vanished from a connection of ours, and on which (``execute``).
        self._vanished: tuple[float, int] | None = None

    def open_first(self) -> bool:
        """Connect, waiting for a server that is not up yet; False if stopped first, CannotConnect if refused."""
        delay = 0.1
        settings = connections[self.options.using].settings_dict
        where = f"database {settings.get('NAME')!r} on {settings.get('HOST') or 'local socket'}"
        if settings.get("PORT"):
            where += f":{settings['PORT']}"
        while True:  # at least one try, so that a worker stopped at once still starts and stops cleanly
            try:
                self._conn = connect(self.options.using, "dispatcher")
                self.opened += 1
                return True
            except psycopg.OperationalError as error:
                if self.control.stopping.is_set():
                    return False
                if dberrors.refused(error):
                    raise CannotConnect(
                        f"cannot connect to {where} as {settings.get('USER') or 'the default user'!r} "
                        f"(DATABASES[{self.options.using!r}]): {dberrors.message(error)}"
                    ) from None
                # A process manager may start workers before PostgreSQL: wait for it.
                logger.warning(
                    "cannot reach %s yet (%s); the worker has not started and retries in %.1fs until the "
                    "database accepts it (SIGTERM stops it)",
                    where,
                    dberrors.message(error),
                    delay,
                )
                self.control.stopping.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)

    def current(self) -> psycopg.Connection[Any] | None:
        """The connection if it is open, else None (the next ``execute`` reconnects)."""
        conn = self._conn
        return None if conn is None or conn.closed else conn

    def close(self) -> None:
        """Close the connection; the next ``execute`` opens another."""
        close(self._conn)
        self._conn = None

    def _reconnect(self) -> psycopg.Connection[Any] | None:
        delay = 0.1
        while not self.control.aborting.is_set():
            try:
                conn = connect(self.options.using, "dispatcher")
                self.opened += 1
                return conn
            except psycopg.OperationalError as error:
                if self.control.stopping.is_set() and (not self.ledger.held() or self._grace_over()):
                    return None  # past the grace period, jobs held stay running under us for the rescue
                logger.warning("dispatcher: cannot reach the database (%s); retrying in %.1fs", error, delay)
                self.control.aborting.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        return None

    def _grace_over(self) -> bool:
        deadline = self.control.deadline
        return deadline is not None and time.monotonic() >= deadline

    def failed(self, what: str, error: psycopg.Error) -> None:
        """A statement run on ``current()`` failed: log it, drop a broken connection, back off."""
        logger.warning("claiming %s failed (%s); trying again shortly", what, error)
        # A timeout cut the statement short on a connection that works (as in ``execute``): no outage.
        if isinstance(error, refused.OUTAGE) and not isinstance(error, _CUT_SHORT):
            self._lost()
            self.close()
        elif isinstance(error, _STALE_STATEMENT):
            self.close()  # a new connection prepares afresh
        self.control.aborting.wait(0.2)

    def execute(
        self,
        query: str,
        params: dict[str, Any],
        *,
        bounded: bool = False,
        binary: bool = False,
        in_place: bool = False,
        refusable: bool = False,
        prepare: bool | None = None,
    ) -> list[tuple[Any, ...]] | None:
        """Run one dispatcher statement; on failure log, back off, return None.

        ``bounded`` runs it under a statement and lock timeout (housekeeping); ``binary``
        has the rows sent in binary, which loads a claim's uuid, float and time columns
        for less (a claimed row's columns: 0.96 against 0.60 us, measured). A
        connection failure reconnects; any other database error is logged, and if
        the dispatcher's statements keep failing for a lease the worker stops (exit 1).
        ``in_place`` and ``refusable``: as the watchman's statements need them
        (heartbeat.Heartbeat._run says how); a refusal raised is not counted as failing.
        ``prepare``: True for a claim, prepared at its first run where the connection prepares
        at all; False never prepared, however often it runs (the start-up's pooler check);
        None left to psycopg's threshold.
        """
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._reconnect()
                if self._conn is None:
                    return None
                if self._lost_at is not None:
                    # Said once, at INFO: the outage's warnings alone left it unsaid that it had ended.
                    logger.info(
                        "the database is back: the dispatcher reconnected after %.1fs; claiming again",
                        time.monotonic() - self._lost_at,
                    )
                    self._lost_at = None
            with contextlib.ExitStack() as stack:
                if bounded:
                    stack.enter_context(self._conn.transaction())
                cursor = stack.enter_context(self._conn.cursor())
                if bounded:
                    cursor.execute(sql.TIMEOUTS, {"statement": STATEMENT_TIMEOUT, "lock": LOCK_TIMEOUT})
                if in_place:
                    cursor.execute(refused.IN_PLACE)
                # ``prepare`` True (the claims): prepared at once where prepared statements are on;
                # left to psycopg's threshold, each worker connection planned a claim five times
                # first (3 ms of server CPU each). Never the others: a statement prepared apart
                # from its run lands in two transactions behind a transaction pooler, and the
                # start-up's probe for one failed there instead of finding it (review).
                if prepare and self._conn.prepare_threshold is None:
                    prepare = None
                cursor.execute(query, params, binary=binary, prepare=prepare)
                rows = cursor.fetchall() if cursor.description else []
        except refused.OUTAGE as error:
            if isinstance(error, _CUT_SHORT):
                logger.warning("dispatcher statement cut short (%s); trying again later", error)
                return None
            logger.warning("dispatcher lost the database (%s); reconnecting", error)
            self._lost()
            self.close()
            self.control.aborting.wait(0.2)
            return None
        except psycopg.Error as error:
            if refusable:
                raise refused.Refused(error) from error
            if isinstance(error, _STALE_STATEMENT):
                # A migration changed the type of a column a prepared claim returns, or the statement
                # vanished: a new connection prepares afresh.
                self.close()
            if isinstance(error, psycopg.errors.InvalidSqlStatementName):
                # "prepared statement does not exist" again, on a newer connection, within a lease: a
                # pooler handing each transaction to another backend, which the start-up's check
                # missed. Claims there fail or land twice; retried, they failed for good, the worker
                # never stopping (its other statements succeeded between them). Once alone is a
                # glitch of one connection (a pipeline cut short as psycopg prepared in it).
                now, last = time.monotonic(), self._vanished
                self._vanished = (now, self.opened)
                if last is not None and now - last[0] <= self.options.lease and self.opened > last[1]:
                    said = POOLER_FOUND_LATE.format(alias=self.options.using, error=error)
                    raise PoolerMisconfigured(said) from error
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            logger.error("dispatcher statement failed (%s: %s); trying again shortly", type(error).__name__, error)
            lease = self.options.lease
            if self.fail_after_lease and now - self._failing_since > lease:
                raise RuntimeError(f"the dispatcher's statements have failed for over {lease:g}s") from error
            self.control.aborting.wait(min(1.0, self.options.poll_interval))
            return None
        self._failing_since = None
        return rows

    def _lost(self) -> None:
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def bounded(
        self, query: str, params: dict[str, Any], *, in_place: bool = False, refusable: bool = False
    ) -> list[tuple[Any, ...]] | None:
        """``execute`` under the housekeeping timeouts."""
        return self.execute(query, params, bounded=True, in_place=in_place, refusable=refusable)
