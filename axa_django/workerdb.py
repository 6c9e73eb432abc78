"""The worker's connections: opening them (keepalives, prepared statements), and the checks at start-up.

``Connections`` is the part of ``Worker`` that opens its first connection, reconnects
through outages, runs bounded statements and checks the tables, the pooler and NOTIFY.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import django
import psycopg
from django.db import InterfaceError, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

from . import conf, dberrors, sql
from .claimlanes import FULL_SCAN_UNNOTIFIED
from .exceptions import CannotConnect, NotMigrated, PoolerMisconfigured

logger = logging.getLogger("axa_django")

CHANNEL = "axa_queue"
# Where a cancel of running jobs is announced (models.JobQuerySet.cancel), the job id as payload.
CANCEL_CHANNEL = "axa_cancel"
RECONNECT_MAX = 5.0
COALESCE = 0.0005
# Housekeeping statements (rescue, never-due rows) may not hold the dispatcher longer.
STATEMENT_TIMEOUT = "5s"
LOCK_TIMEOUT = "1s"
# How long the start-up round trip through the listener may take before we poll.
NOTIFY_PROBE_SECONDS = 2.0


def _prepare_threshold(using: str) -> int | None:
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
    params["prepare_threshold"] = _prepare_threshold(using)
    for key, value in keepalives(float(conf.get("LEASE_SECONDS"))).items():
        params.setdefault(key, value)  # the project's OPTIONS win
    params.setdefault("application_name", f"axa_django {purpose}")
    conn = psycopg.connect(autocommit=True, **params)
    if params["prepare_threshold"] is not None:
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
        conn.execute(
            "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
            "set_config('idle_in_transaction_session_timeout', %s, false), "
            "set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false), "
            "set_config('jit', 'off', false)",
            [f"{idle}ms"],
        )
    return conn


def task_backend_aliases() -> list[str]:
    """settings.TASKS aliases whose backend is axa_django's QueueBackend (none before Django 6.0)."""
    if django.VERSION < (6, 0):
        return []
    # Lazy: backends imports django.tasks, which exists only on Django >= 6.
    from .backends import queue_backend_aliases

    return queue_backend_aliases()


class Connections:
    """Start-up and reconnection for ``Worker`` (a mixin: the attributes are the worker's)."""

    def _first_connection(self) -> psycopg.Connection[Any] | None:
        """Connect the dispatcher, waiting for a server that is not up yet; CannotConnect if it refuses us."""
        delay = 0.1
        settings = connections[self.using].settings_dict
        where = f"database {settings.get('NAME')!r} on {settings.get('HOST') or 'local socket'}"
        if settings.get("PORT"):
            where += f":{settings['PORT']}"
        while True:  # at least one try, so that a worker stopped at once still starts and stops cleanly
            try:
                return connect(self.using, "dispatcher")
            except psycopg.OperationalError as error:
                if self._stopping.is_set():
                    break
                if dberrors.refused(error):
                    raise CannotConnect(
                        f"cannot connect to {where} as {settings.get('USER') or 'the default user'!r} "
                        f"(DATABASES[{self.using!r}]): {dberrors.message(error)}"
                    ) from None
                # A process manager may start workers before PostgreSQL: wait for it.
                logger.warning(
                    "cannot reach %s yet (%s); the worker has not started and retries in %.1fs until the "
                    "database accepts it (SIGTERM stops it)",
                    where,
                    dberrors.message(error),
                    delay,
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        return None

    def _reconnect_until_ready(self, purpose: str) -> psycopg.Connection[Any] | None:
        delay = 0.1
        while not self._aborting.is_set():
            try:
                return connect(self.using, purpose)
            except psycopg.OperationalError as error:
                if self._stopping.is_set() and not self._in_flight:
                    return None
                logger.warning("%s: cannot reach the database (%s); retrying in %.1fs", purpose, error, delay)
                self._aborting.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
        return None

    def _claim_failed(self, what: str, conn: psycopg.Connection[Any], error: psycopg.Error) -> None:
        """A limited claim failed: log it, drop a broken connection (the next statement reconnects), back off."""
        logger.warning("claiming %s failed (%s); trying again shortly", what, error)
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            self._close(conn)
            self._conn = None
        self._aborting.wait(0.2)

    def _execute(self, query: str, params: dict[str, Any], *, bounded: bool = False) -> list[tuple[Any, ...]] | None:
        """Run one dispatcher statement; on failure log, back off, return None.

        ``bounded`` runs it under a statement and lock timeout (housekeeping). A
        connection failure reconnects; any other database error is logged, and if
        the dispatcher's statements keep failing for a lease the worker stops (exit 1).
        """
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._reconnect_until_ready("dispatcher")
                if self._conn is None:
                    return None
            with contextlib.ExitStack() as stack:
                if bounded:
                    stack.enter_context(self._conn.transaction())
                cursor = stack.enter_context(self._conn.cursor())
                if bounded:
                    cursor.execute(sql.TIMEOUTS, {"statement": STATEMENT_TIMEOUT, "lock": LOCK_TIMEOUT})
                cursor.execute(query, params)
                rows = cursor.fetchall() if cursor.description else []
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            if isinstance(error, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
                logger.warning("dispatcher statement cut short (%s); trying again later", error)
                return None
            logger.warning("dispatcher lost the database (%s); reconnecting", error)
            self._close(self._conn)
            self._conn = None
            self._aborting.wait(0.2)
            return None
        except psycopg.Error as error:
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            logger.error("dispatcher statement failed (%s: %s); trying again shortly", type(error).__name__, error)
            if now - self._failing_since > self.lease:
                raise RuntimeError(f"the dispatcher's statements have failed for over {self.lease:g}s") from error
            self._aborting.wait(min(1.0, self.poll_interval))
            return None
        self._failing_since = None
        return rows

    def _check_tables(self) -> None:
        rows = self._execute("SELECT to_regclass('axa_queue') IS NULL OR to_regclass('axa_worker') IS NULL", {})
        name = connections[self.using].settings_dict.get("NAME")
        if rows and rows[0][0]:
            self._close(self._conn)
            raise NotMigrated(f"the queue tables do not exist in database {name!r}: run python manage.py migrate first")
        # Tables of an older release: every statement naming a newer column would fail
        # while the worker idled, so it says so now, as for missing tables.
        missing = self._missing_migrations()
        if missing:
            self._close(self._conn)
            raise NotMigrated(
                f"database {name!r} lacks migration(s) {', '.join(missing)} of axa_django, which this version "
                "needs: run python manage.py migrate first"
            )

    def _missing_migrations(self) -> list[str]:
        """The app's migrations the database lacks, read through a restart of the server (retried until stopped)."""
        delay = 0.1
        while True:
            try:
                executor = MigrationExecutor(connections[self.using])
                targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "axa_django"]
                plan = executor.migration_plan(targets)
                return [migration.name for migration, _ in plan if migration.app_label == "axa_django"]
            except (OperationalError, InterfaceError) as error:
                # A server restarting as the worker starts (its other steps reconnect alike).
                if self._aborting.is_set():
                    return []
                logger.warning("cannot read the applied migrations (%s); retrying in %.1fs", error, delay)
                self._aborting.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX)
            finally:
                connections[self.using].close()

    def _check_pooler(self) -> None:
        """Refuse, or fall back from, what a transaction pooler (PgBouncer) breaks.

        Two connections of one process served by the same server backend can only
        mean a pooler handing out backends per transaction: prepared statements and
        LISTEN then land on whichever backend the pooler picked.
        """
        if self.pooling:
            return
        try:
            probe = connect(self.using, "probe")
        except psycopg.OperationalError:
            return
        shared = False
        try:
            for _ in range(3):
                mine = self._execute("SELECT pg_backend_pid()", {})
                theirs = probe.execute("SELECT pg_backend_pid()").fetchone()
                if mine and theirs and mine[0][0] == theirs[0]:
                    shared = True
                    break
        except psycopg.Error:
            pass
        finally:
            self._close(probe)
        if not shared:
            return
        alias = self.using
        if _prepare_threshold(alias) is not None:
            self._close(self._conn)
            raise PoolerMisconfigured(
                f"database {alias!r} is reached through a pooler in transaction mode (PgBouncer's pool_mode = "
                "transaction): two of this worker's connections were served by one PostgreSQL backend. There the "
                "worker's prepared statements fail and jobs run twice, so it stops before claiming any. Set "
                "AXA_DJANGO['TRANSACTION_POOLING'] = True (no prepared statements, no LISTEN), or connect the "
                "worker to PostgreSQL directly or through a session-mode pool."
            )
        if self.notify:
            logger.warning(
                "database %r is reached through a pooler in transaction mode (PgBouncer?), where LISTEN/NOTIFY "
                "does not work: polling every %.1fs instead. Set AXA_DJANGO['TRANSACTION_POOLING'] = True "
                "(or 'NOTIFY': False) to say so and silence this warning.",
                alias,
                self.poll_interval,
            )
            self.notify = False
            self._lanes.full_scan = FULL_SCAN_UNNOTIFIED

    def _check_notify(self) -> None:
        """Send ourselves a notification; if the listener never hears it, poll instead."""
        if not self._listening.wait(NOTIFY_PROBE_SECONDS):
            return  # the listener is still connecting; it wakes us once it listens
        self._execute("SELECT pg_notify(%(channel)s, %(payload)s)", {"channel": CHANNEL, "payload": self._probe})
        if self._probe_seen.wait(NOTIFY_PROBE_SECONDS):
            return
        logger.warning(
            "the listener did not receive this worker's own NOTIFY within %.0fs: LISTEN/NOTIFY does not reach this "
            "worker (PgBouncer in transaction mode?). Polling every %.1fs instead; set AXA_DJANGO['NOTIFY'] = "
            "False, or 'TRANSACTION_POOLING': True behind a transaction pooler.",
            NOTIFY_PROBE_SECONDS,
            self.poll_interval,
        )
        self.notify = False
        self._lanes.full_scan = FULL_SCAN_UNNOTIFIED

    @staticmethod
    def _close(conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
