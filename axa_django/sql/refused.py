"""A row the database refuses to write: isolated from its batch, finished in place, counted.

A statement that writes many rows fails whole when one of them is refused: a user's
foreign key to ``axa_queue`` that its move into the history breaks, a user's trigger
that raises, a unique key. The finisher, the rescue, pruning, cancel and retry then
write their rows one at a time (``each``): the refused row is tried once more with
``axa.in_place`` on, so that ``axa_history_keep`` leaves it in ``axa_queue`` (migration
0001), and is given an errors entry of type ``HistoryRefused`` saying why; a row that
cannot be written even so is logged with its id and reason and left for the next
round. The others go on either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import psycopg

from . import FAIL_NEVER_DUE, RECONCILE, RESCUE

logger = logging.getLogger("axa_django")

# Stored in errors[].type, read back by django.tasks with import_string.
REFUSED_TYPE = "axa_django.exceptions.HistoryRefused"

# This transaction only: axa_history_keep leaves the rows it finishes where they are. Every
# row, in a transaction of the worker's own; one row (IN_PLACE_ROW), in a transaction that
# may be a caller's, where the setting outlives the savepoint it was set in.
IN_PLACE = "SELECT set_config('axa.in_place', 'all', true)"
IN_PLACE_ROW = "SELECT set_config('axa.in_place', %(id)s::text, true)"
NOT_IN_PLACE = "SELECT set_config('axa.in_place', '', true)"

# Say on a row finished in place why it is not in the history.
NOTE = """
UPDATE ONLY axa_queue
SET errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts, 'at', now(), 'worker', worker_id, 'type', %(type)s::text, 'message', %(message)s::text,
        'traceback', '')),
    updated_at = now()
WHERE id = %(id)s AND status IN ('completed', 'failed', 'cancelled')
"""

# Rows finished in place because the history refused them (jobhealth, metrics). Finished
# rows of axa_queue itself are few (these, and rows inserted finished), and the finished
# index of axa_queue holds only them.
COUNT = f"""
SELECT count(*) FROM ONLY axa_queue
WHERE finished_at IS NOT NULL AND errors @> '[{{"type": "{REFUSED_TYPE}"}}]'::jsonb
"""

# The worker's outcome of one attempt, written in place (its move was refused): sql.FINISH
# for one outcome as one UPDATE (a retry is written as FINISH writes it; one whose cancel
# was asked ends cancelled, by the axa_queue_requeue guard, and stays here).
FINISH_IN_PLACE = """
WITH v AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(outcomes)s::jsonb)
        AS v(id uuid, status text, error text, result jsonb, entry jsonb, delay float8, started float8)
)
UPDATE ONLY axa_queue q
SET status = v.status, error = CASE WHEN v.status = 'completed' THEN q.error ELSE v.error END,
    result = v.result -> 'v',
    started_at = CASE WHEN v.status = 'queued' THEN NULL ELSE COALESCE(q.started_at, to_timestamp(v.started)) END,
    errors = CASE WHEN v.entry IS NULL THEN q.errors ELSE q.errors || jsonb_build_array(v.entry) END,
    run_at = CASE WHEN v.status = 'queued' THEN now() + make_interval(secs => v.delay) ELSE q.run_at END,
    worker_id = CASE WHEN v.status = 'queued' THEN NULL ELSE q.worker_id END,
    finished_at = CASE WHEN v.status = 'queued' THEN NULL ELSE now() END, updated_at = now()
FROM v
WHERE q.id = v.id AND q.status || '' = 'running' AND q.worker_id IS NOT DISTINCT FROM %(worker)s
RETURNING q.id, q.status
"""

# The rescue one row at a time: the rows it would take, then one of them; a job it fails
# whose move was refused gets the HistoryRefused entry too (%(refused)s, else NULL).
_TAKE = "\n)\nUPDATE ONLY axa_queue q"
assert RESCUE.count(_TAKE) == 1, "RESCUE changed shape"
# Rows refused even in place are passed over from then on (%(skip)s): each round tried them
# first, and enough of them used up the heartbeat's time before any other row.
_SKIP_LOCKED = "    FOR UPDATE OF q SKIP LOCKED"
assert RESCUE.count(_SKIP_LOCKED) == 1, "RESCUE changed shape"
RESCUE_LOST = (
    RESCUE.split(_TAKE)[0].replace(_SKIP_LOCKED, "      AND q.id <> ALL(%(skip)s::uuid[])\n" + _SKIP_LOCKED)
    + "\n)\nSELECT id FROM lost ORDER BY id"
)
_REFUSED_ENTRY = """ || CASE WHEN {when} AND %(refused)s::text IS NOT NULL THEN jsonb_build_array(jsonb_build_object(
        'attempt', q.attempts, 'at', now(), 'worker', q.worker_id, 'type', %(refused_type)s::text,
        'message', %(refused)s::text, 'traceback', '')) ELSE '[]'::jsonb END
FROM {source}"""
RESCUE_ONE = RESCUE.replace(
    "    WHERE q.status = 'running' AND (", "    WHERE q.id = %(id)s AND q.status = 'running' AND ("
).replace("'traceback', ''))\nFROM lost", "'traceback', ''))" + _REFUSED_ENTRY.format(when="lost.spent", source="lost"))
assert RESCUE_ONE.count("%(id)s") == 1 and RESCUE_ONE.count("%(refused)s") == 2, "RESCUE changed shape"

# FAIL_NEVER_DUE the same way.
NEVER_DUE_IDS = (
    FAIL_NEVER_DUE.split("\n)\nUPDATE ONLY axa_queue q")[0].replace(
        "WHERE status = 'queued'", "WHERE id <> ALL(%(skip)s::uuid[]) AND status = 'queued'"
    )
    + "\n)\nSELECT id FROM never ORDER BY id"
)
FAIL_NEVER_DUE_ONE = FAIL_NEVER_DUE.replace(
    "FROM ONLY axa_queue WHERE status = 'queued'", "FROM ONLY axa_queue WHERE id = %(id)s AND status = 'queued'"
).replace("'traceback', ''))\nFROM never", "'traceback', ''))" + _REFUSED_ENTRY.format(when="true", source="never"))
assert FAIL_NEVER_DUE_ONE.count("%(id)s") == 1, "FAIL_NEVER_DUE changed shape"
assert "SELECT id FROM never" in NEVER_DUE_IDS and "%(skip)s" in NEVER_DUE_IDS, "FAIL_NEVER_DUE changed shape"

# What the worker waits out and reconnects through, never a row's fault: a lost or refused
# connection, a timeout, and a server that became read-only under it (a demoted primary,
# a failover that reached a standby).
OUTAGE = (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction)

# RECONCILE the same way (a user's trigger refusing one row failed it for every stray row).
RECONCILE_IDS = (
    RECONCILE.split("\n)\nUPDATE ONLY axa_queue q")[0].replace(
        "WHERE worker_id = %(worker)s", "WHERE id <> ALL(%(skip)s::uuid[]) AND worker_id = %(worker)s"
    )
    + "\n)\nSELECT id FROM stray ORDER BY id"
)
RECONCILE_ONE = RECONCILE.replace("WHERE worker_id = %(worker)s", "WHERE id = %(id)s AND worker_id = %(worker)s")
assert "%(skip)s" in RECONCILE_IDS and RECONCILE_ONE.count("%(id)s") == 1, "RECONCILE changed shape"

K = TypeVar("K")


def reason(error: BaseException) -> str:
    """What the database said, on one line, for a log line and an errors entry."""
    if isinstance(error, Refused):
        return str(error)
    cause = error.__cause__ if error.__cause__ is not None else error
    text = " ".join(str(cause).split()) or type(cause).__name__
    return f"{type(cause).__name__}: {text}"[:2000]


def note(why: str) -> str:
    return (
        f"the database refused to move this finished job into the history ({why}), so it was finished in place, "
        "in axa_queue; a foreign key to axa_queue with a database constraint does this: declare it with "
        "db_constraint=False"
    )


class Refused(Exception):
    """A statement the database refused for a row's sake (not a lost connection, not a timeout)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(reason(error))
        self.error = error


def refusal(error: BaseException) -> bool:
    """Whether the database refused a statement for a row's sake: any error it raised but a lost
    connection or a timeout (psycopg's, or Django's wrapping one)."""
    if isinstance(error, Refused):
        return True
    cause = error if isinstance(error, psycopg.Error) else error.__cause__
    return isinstance(cause, psycopg.Error) and not isinstance(cause, OUTAGE)


def each(
    keys: Iterable[K],
    write: Callable[[K, str | None], Any],
    refusal: Callable[[BaseException], bool],
    what: str,
    refused: dict[K, str] | None = None,
) -> dict[K, str]:
    """Write each key alone (``write(key, None)``, a transaction of its own); return those refused, with why.

    A key refused as it is goes once more in place (``write(key, why)``, ``why`` the
    first refusal). ``refusal`` tells a refused row from a lost connection or a timeout,
    which ends the round (raised to the caller); ``refused``, if given, is filled as it goes.
    """
    refused = {} if refused is None else refused
    for key in keys:
        try:
            write(key, None)
            continue
        except Exception as error:
            if not refusal(error):
                raise
            first = reason(error)
        try:
            write(key, first)
            logger.error("%s %s was refused as it was (%s); it was finished in place, in axa_queue", what, key, first)
        except Exception as error:
            if not refusal(error):
                raise
            refused[key] = f"{first}; in place: {reason(error)}"
            logger.error("%s %s could not be written (%s); the others went on", what, key, refused[key])
    return refused
