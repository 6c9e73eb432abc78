"""Telling a database that refuses us (wrong password, no such database) from one that is not up yet."""

from __future__ import annotations

import re

import psycopg

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
