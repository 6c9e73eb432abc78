"""Telling a database that refuses us (wrong password, no such database) from one that is not up yet,
and a job's error that is the database going away under it from the job's own; a job thread's
connections checked after an outage."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import psycopg
from django.db import InterfaceError, OperationalError, connections

from .. import conf

# libpq reports a refused connection as text only (psycopg's sqlstate is None then), so
# the server's messages for SQLSTATE class 28 (authentication, unknown role) and 3D000
# (no such database), and libpq's own for a missing password, are matched as written
# by PostgreSQL in English. A server whose lc_messages is another language is retried
# as if it were not up yet, saying so with its message.
_REFUSED = re.compile(
    r"authentication failed for user"
    r"|no pg_hba\.conf entry for"
    r"|pg_hba\.conf rejects connection"
    r"|role \".*\" does not exist"
    r"|role \".*\" is not permitted to log in"
    r"|database \".*\" does not exist"
    r"|permission denied for database"
    r"|no password supplied"
)


class ReadOnlyServer(psycopg.OperationalError):
    """The server reached takes no writes (a standby in recovery, or default_transaction_read_only on).

    An OperationalError, so that every loop of the worker waits and reconnects through it
    as through an outage: with a multi-host connection string, libpq's next try may reach
    the primary; a standby may be promoted.
    """


# Whether a session can write: asked once per connection.
READ_ONLY = "pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"


def refused(error: psycopg.Error) -> bool:
    """Whether ``error`` says the server refused these credentials or this database (retrying cannot help)."""
    code = getattr(error, "sqlstate", None)
    if code:
        return code.startswith("28") or code == "3D000"
    return bool(_REFUSED.search(str(error)))


def message(error: psycopg.Error) -> str:
    """The server's message in ``error``, on one line."""
    text = str(error).strip()
    text = text.removeprefix("connection failed: ")
    return " ".join(text.split())


# What a connection that died under the job raises (psycopg's, and Django's wrappers of them).
_CONNECTION_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# A server going away, never a statement failing on a live connection: class 08 (connection
# exception), or the server shutting down or not taking connections yet (57P01-57P03).
_GONE = ("57P01", "57P02", "57P03")


# A write refused in a read-only transaction: the job's own error (it set its transaction
# read-only), unless the server says every session is (a standby, default_transaction_read_only).
_READ_ONLY_WRITE = "25006"


def _on_read_only_server(connection: Any) -> bool:
    """Whether the server takes no writes on this Django connection of the queue's own database: a
    standby, or default_transaction_read_only set for the server or the database. PostgreSQL 14+
    reports both settings as they change (after the session's next statement); set by the
    session or its connection options, the setting is the job's or the project's, not the server's.
    Another alias may be a read replica by design: a refusal there is the job's error."""
    raw = connection.connection
    info = getattr(raw, "info", None)
    if connection.alias != conf.get("DATABASE") or raw is None or getattr(raw, "closed", True) or info is None:
        return False
    if info.parameter_status("in_hot_standby") == "on":
        return True
    if info.parameter_status("default_transaction_read_only") != "on":
        return False
    try:
        with raw.cursor() as cursor:
            cursor.execute("SELECT source FROM pg_settings WHERE name = 'default_transaction_read_only'")
            row = cursor.fetchone()
    except psycopg.Error:  # a transaction the job left failed: no verdict, the error stays the job's
        return False
    return row is not None and row[0] not in ("session", "client")


def database_lost(error: BaseException) -> bool:
    """Whether ``error`` is the database going away under the job, not the job's own failure.

    It must be (or be caused by) a connection error that says the server went away (an
    OperationalError without SQLSTATE is libpq's: a connection refused or dropped), or
    one of this thread's Django connections must be broken now. A statement_timeout, a
    deadlock or a lock timeout raise OperationalError too, on a connection that still
    works, and are the job's; so are refused credentials and a database that does not exist.
    A write refused as read-only is lost too when the server now takes no writes at all
    (a failover reached a standby, or the server was turned read-only under the job).
    """
    found = read_only = False
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        read_only = read_only or getattr(cause, "sqlstate", None) == _READ_ONLY_WRITE
        if isinstance(cause, _CONNECTION_ERRORS):
            found = True
            if isinstance(cause, psycopg.OperationalError) and not refused(cause):
                code = cause.sqlstate
                if code is None or code.startswith("08") or code in _GONE:
                    return True
        cause = cause.__cause__ or cause.__context__
    if read_only and any(_on_read_only_server(c) for c in connections.all(initialized_only=True)):
        return True
    if not found:
        return False
    for connection in connections.all(initialized_only=True):
        raw = connection.connection
        if raw is not None and (raw.closed or raw.broken):
            return True
    return False


def check_connections() -> list[str]:
    """Close this thread's Django connections that fail a health check; return their aliases.

    Run by a job thread before its next job once the worker has seen an outage: a
    connection the server dropped meanwhile (a restart ends every session) would fail
    that job at its first query, and the job would run again as lost. So would one whose
    server takes no writes now: a new connection may reach the one that does.
    """
    closed = []
    for connection in connections.all(initialized_only=True):
        # is_usable() first: its statement brings the server's settings up to date (see above).
        if connection.connection is not None and (not connection.is_usable() or _on_read_only_server(connection)):
            # Django drops the connection even when closing it raises: the next job opens another.
            with contextlib.suppress(Exception):
                connection.close()
            closed.append(connection.alias)
    return closed
