"""The checks a worker makes as it starts: the tables and migrations, a transaction pooler, NOTIFY."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

from ..exceptions import NotMigrated, PoolerMisconfigured
from .connection import (
    CHANNEL,
    POOLER_ADVICE,
    RECONNECT_MAX,
    DispatcherConnection,
    close,
    connect,
    prepare_threshold,
)
from .control import Control
from .listener import Listener
from .options import Options

logger = logging.getLogger("axa_django")

# How long the start-up round trip through the listener may take before we poll.
NOTIFY_PROBE_SECONDS = 2.0
# Tries of the pooler check, three statements each: nine round trips where there is no pooler.
POOLER_TRIES = 3
# Run unprepared on both connections: behind a transaction pooler a statement prepared in
# one transaction runs in another, and failed instead of telling.
BACKEND_PID = "SELECT pg_backend_pid()"


def check_tables(db: DispatcherConnection, options: Options, control: Control) -> None:
    """NotMigrated unless the queue tables exist with every migration this version needs."""
    rows = db.execute("SELECT to_regclass('axa_queue') IS NULL OR to_regclass('axa_worker') IS NULL", {})
    name = connections[options.using].settings_dict.get("NAME")
    if rows and rows[0][0]:
        db.close()
        raise NotMigrated(f"the queue tables do not exist in database {name!r}: run python manage.py migrate first")
    # Tables of an older release: every statement naming a newer column would fail
    # while the worker idled, so it says so now, as for missing tables.
    missing = missing_migrations(options.using, control)
    if missing:
        db.close()
        raise NotMigrated(
            f"database {name!r} lacks migration(s) {', '.join(missing)} of axa_django, which this version "
            "needs: run python manage.py migrate first"
        )


def missing_migrations(using: str, control: Control) -> list[str]:
    """The app's migrations the database lacks, read through a restart of the server (retried until aborted)."""
    delay = 0.1
    while True:
        try:
            executor = MigrationExecutor(connections[using])
            targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "axa_django"]
            plan = executor.migration_plan(targets)
            return [migration.name for migration, _ in plan if migration.app_label == "axa_django"]
        except (OperationalError, InterfaceError) as error:
            # A server restarting as the worker starts (its other steps reconnect alike).
            if control.aborting.is_set():
                return []
            logger.warning("cannot read the applied migrations (%s); retrying in %.1fs", error, delay)
            control.aborting.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX)
        finally:
            connections[using].close()


def check_pooler(db: DispatcherConnection, options: Options, listener: Listener) -> None:
    """Refuse, or fall back from, what a transaction pooler (PgBouncer) breaks.

    Two connections of one process served by the same server backend, or one connection
    served by one backend and then another, can only mean a pooler handing out backends
    per transaction: prepared statements and LISTEN then land on whichever backend the
    pooler picked.
    """
    if options.pooling:
        return
    probe: psycopg.Connection[Any] | None
    try:
        probe = connect(options.using, "probe")
    except psycopg.OperationalError:
        # A pool refusing one more client (max_client_conn, a database paused): the dispatcher's
        # own reads may still give it away, and were skipped with the probe (review).
        probe = None
    try:
        seen = pooled(db, probe)
    finally:
        close(probe)
    if seen is None:
        return
    alias = options.using
    if prepare_threshold(alias) is not None:
        db.close()
        raise PoolerMisconfigured(
            f"database {alias!r} is reached through a pooler in transaction mode (PgBouncer's pool_mode = "
            f"transaction): {seen}. There the worker's prepared statements fail and jobs run twice, so it "
            f"stops before claiming any. {POOLER_ADVICE}"
        )
    if listener.enabled:
        logger.warning(
            "database %r is reached through a pooler in transaction mode (PgBouncer?), where LISTEN/NOTIFY "
            "does not work: polling every %.1fs instead. Set AXA_DJANGO['TRANSACTION_POOLING'] = True "
            "(or 'NOTIFY': False) to say so and silence this warning.",
            alias,
            options.poll_interval,
        )
        listener.poll_instead()


def pooled(db: DispatcherConnection, probe: psycopg.Connection[Any] | None) -> str | None:
    """What the backends serving the dispatcher's connection and ``probe`` give away of a transaction pooler.

    Behind a busy pool the two rarely meet on one backend: the pooler hands each
    transaction (each autocommit statement) to whichever server connection is free, so
    each of them moving from backend to backend is the surer sign. A connection's backend
    is its own for life otherwise, so only pids read while both connections stayed the
    same are compared. Without ``probe`` (it could not connect, or failed), the dispatcher's alone.
    """
    opened = db.opened
    mine: set[int] = set()
    theirs: set[int] = set()
    # The dispatcher's twice in a row: two connections taking turns on a pool that hands
    # out its servers in turn (server_round_robin) each got a server of their own at each turn.
    for reader in ("dispatcher", "dispatcher", "probe") * POOLER_TRIES:
        if reader == "probe":
            if probe is None:
                continue
            try:
                theirs.add(backend_pid(probe))
            except psycopg.Error:
                probe, theirs = None, set()
                continue
        else:
            # An error is said and waited out by the dispatcher, which reconnects at its next
            # statement if it lost the database, as it did for the check's reads before.
            rows = db.execute(BACKEND_PID, {}, prepare=False)
            if db.opened != opened:
                # A new connection has a new backend, whose pid may be one the outage freed:
                # the probe's, read before it. The reads before it are compared with nothing.
                opened, mine, theirs = db.opened, set(), set()
            if not rows:
                continue
            mine.add(rows[0][0])
        if len(mine) > 1 or len(theirs) > 1:
            return "one of this worker's connections was served by one PostgreSQL backend, then by another"
        if mine & theirs:
            return "two of this worker's connections were served by one PostgreSQL backend"
    return None


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    [(pid,)] = conn.execute(BACKEND_PID, prepare=False).fetchall()
    return int(pid)


def check_notify(db: DispatcherConnection, options: Options, listener: Listener) -> None:
    """Send ourselves a notification; if the listener never hears it, poll instead."""
    if not listener.listening.wait(NOTIFY_PROBE_SECONDS):
        return  # the listener is still connecting; it wakes us once it listens
    db.execute("SELECT pg_notify(%(channel)s, %(payload)s)", {"channel": CHANNEL, "payload": listener.probe})
    if listener.probe_seen.wait(NOTIFY_PROBE_SECONDS):
        return
    logger.warning(
        "the listener did not receive this worker's own NOTIFY within %.0fs: LISTEN/NOTIFY does not reach this "
        "worker (PgBouncer in transaction mode?). Polling every %.1fs instead; set AXA_DJANGO['NOTIFY'] = "
        "False, or 'TRANSACTION_POOLING': True behind a transaction pooler.",
        NOTIFY_PROBE_SECONDS,
        options.poll_interval,
    )
    listener.poll_instead()
