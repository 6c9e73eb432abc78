"""Retention by table: close the history table every RETENTION / 4, drop closed ones past RETENTION.

Finished jobs live in ``axa_history``, a table inheriting ``axa_queue`` (the initial
migration). Closing renames it ``axa_history_<number>`` and gives its name to a table made
beforehand (``axa_history_next``), in one short transaction: a rename waits for the
statements using the table and holds the finishes back while it runs, so everything
slow (creating the table and its indexes) happens before it. A closed table is dropped
whole once its close is older than RETENTION: no row is deleted, no dead row is left.
Each step is bounded by a short lock timeout and tried again at the next round; a
``pg_dump`` holding the tables only delays it.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db import transaction

from .pruning import DELETE_LINKS

# A rename or a drop queues behind the statements using the table and holds new ones
# back while it waits (the finishes for a rename, readers of axa_queue that read the
# history for a drop): it gives up soon, to try again at the next round.
LOCK_TIMEOUT = "100ms"

NEXT = "axa_history_next"
CURRENT = "axa_history"

# One rotation at a time across workers (an advisory lock of this namespace).
LOCK = "SELECT pg_try_advisory_xact_lock(178913281, 0)"

# Rows of a table about to be dropped that other tables name: workflow edges and workflows.
LINKED = """
SELECT array_agg(id) FILTER (WHERE has_children OR on_parent_failure IS NOT NULL),
       array_agg(DISTINCT workflow_id) FILTER (WHERE workflow_id IS NOT NULL)
FROM {table} WHERE has_children OR on_parent_failure IS NOT NULL OR workflow_id IS NOT NULL
"""


def _name(number: int) -> str:
    return f"axa_history_{int(number)}"


def _locked(cursor: Any) -> bool:
    """Take the rotation's lock for this transaction, or say another worker holds it."""
    cursor.execute(LOCK)
    return bool(cursor.fetchone()[0])


def prepare(cursor: Any) -> bool:
    """Make ``axa_history_next`` if it is missing; return whether it was made."""
    if not _locked(cursor):
        return False
    cursor.execute("SELECT 1 FROM axa_history_part WHERE opened_at IS NULL")
    if cursor.fetchone() is not None:
        return False
    cursor.execute(
        "WITH n AS (SELECT nextval('axa_history_number') AS number) SELECT axa_history_make(%s, number), number FROM n",
        [NEXT],
    )
    number = cursor.fetchone()[1]
    cursor.execute("INSERT INTO axa_history_part (number) VALUES (%s)", [number])
    return True


def close(cursor: Any, period: datetime.timedelta) -> int | None:
    """Close ``axa_history`` if it was opened at least ``period`` ago; return the closed table's number."""
    if not _locked(cursor):
        return None
    cursor.execute(
        "SELECT (SELECT number FROM axa_history_part WHERE opened_at IS NOT NULL AND closed_at IS NULL "
        "        AND opened_at <= now() - %s), "
        "       (SELECT number FROM axa_history_part WHERE opened_at IS NULL)",
        [period],
    )
    current, following = cursor.fetchone()
    if current is None or following is None:
        return None
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
    cursor.execute(f"ALTER TABLE {CURRENT} RENAME TO {_name(current)}")
    cursor.execute(f"ALTER TABLE {NEXT} RENAME TO {CURRENT}")
    cursor.execute("UPDATE axa_history_part SET closed_at = now() WHERE number = %s", [current])
    cursor.execute("UPDATE axa_history_part SET opened_at = now() WHERE number = %s", [following])
    return int(current)


def drop(cursor: Any, retention: datetime.timedelta) -> int | None:
    """Drop the oldest closed table whose close is older than ``retention``; return its number.

    One transaction (a savepoint inside the caller's): the table is locked, its linked
    rows read, the table dropped and their edges deleted, all or nothing.
    """
    with transaction.atomic(using=cursor.db.alias):
        return _drop(cursor, retention)


def _drop(cursor: Any, retention: datetime.timedelta) -> int | None:
    if not _locked(cursor):
        return None
    cursor.execute(
        "SELECT number FROM axa_history_part WHERE closed_at <= now() - %s ORDER BY number LIMIT 1", [retention]
    )
    row = cursor.fetchone()
    if row is None:
        return None
    table = _name(row[0])
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
    if cursor.fetchone()[0]:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
        # Locked before its linked rows are read: a retry committing in between would move
        # a parent and its child out of the table, and the drop then took their edges with
        # it (the child waited for ever). A retry now waits for the drop, or the drop gives
        # up. EXCLUSIVE stops writers and lets readers on while the links are read (a second
        # or more on a big table); the DROP takes the rest.
        cursor.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        cursor.execute(LINKED.format(table=table))
        linked, groups = cursor.fetchone()
        cursor.execute(f"DROP TABLE {table}")
        if linked or groups:
            cursor.execute(DELETE_LINKS, {"ids": linked or [], "groups": groups or []})
    cursor.execute("DELETE FROM axa_history_part WHERE number = %s", [row[0]])
    return int(row[0])
