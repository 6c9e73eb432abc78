"""Retry and cancel over a queryset of jobs: one statement each, row by row when the database refuses one row.

A retry moves a failed job back from the history, a cancel moves a queued one into it;
a user's trigger or foreign key may refuse one row's move, which failed the whole
statement (the admin's action returned 500 for every row selected). Then each row goes
alone: a cancel refused as it is is done in place (sql/refused.py), a retry refused
is left failed and reported in ``RetryResult.refused``; the others are written.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, models, transaction

from .. import dependencies, sql
from ..sql import refused

logger = logging.getLogger("axa_django")

# One row of sql.RETRY: the job's id, whether it was queued again, and else the job holding its key.
Row = tuple[uuid.UUID, bool, uuid.UUID | None]

# The foreign keys to axa_queue that wait for the commit to be checked.
DEFERRED_KEYS = """
SELECT format('%I.%I', n.nspname, c.conname), c.condeferred
FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
WHERE c.contype = 'f' AND c.confrelid = 'axa_queue'::regclass AND c.condeferrable
"""

# Queued and waiting rows are cancelled, running ones flagged (their workers told), in one
# statement: a row that a finish queues again, or a claim takes, while this waits on its
# lock is judged as it is then. Two statements missed such a row twice (the cancel
# returned 0 and the job ran again). The SET reads the row as it was before this update.
CANCEL = """
WITH changed AS (
    UPDATE axa_queue
    SET status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
        cancel_requested = cancel_requested OR status = 'running',
        finished_at = CASE WHEN status = 'running' THEN finished_at ELSE now() END,
        updated_at = now()
    WHERE id IN ({subquery}) AND (status IN ('queued', 'waiting') OR (status = 'running' AND NOT cancel_requested))
    RETURNING id, status, has_children
)
SELECT id, status, has_children, CASE WHEN status = 'running' THEN pg_notify('axa_cancel', id::text) END
FROM changed
"""


class RetryResult(int):
    """How many jobs a retry queued again.

    ``skipped`` maps each failed job left failed because its unique key is in use to
    the job holding that key (None if that job finished before it could be named);
    ``refused`` maps each job the database refused to queue again (a user's trigger,
    say) to what it said.
    """

    skipped: dict[uuid.UUID, uuid.UUID | None]
    refused: dict[uuid.UUID, str]

    def __new__(
        cls,
        changed: int,
        skipped: dict[uuid.UUID, uuid.UUID | None] | None = None,
        refused: dict[uuid.UUID, str] | None = None,
    ) -> RetryResult:
        result = super().__new__(cls, changed)
        result.skipped = skipped or {}
        result.refused = refused or {}
        return result


@contextlib.contextmanager
def checked_now(using: str) -> Iterator[None]:
    """Inside a transaction: the deferred foreign keys to axa_queue checked at each statement, as declared after.

    A refusal then fails the statement, in its savepoint, instead of the caller's commit.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(DEFERRED_KEYS)
        keys = cursor.fetchall()
        if keys:
            cursor.execute(f"SET CONSTRAINTS {', '.join(name for name, _ in keys)} IMMEDIATE")
        try:
            yield
        finally:
            deferred = [name for name, initially in keys if initially]
            if deferred and not connections[using].needs_rollback:
                with contextlib.suppress(DatabaseError):
                    cursor.execute(f"SET CONSTRAINTS {', '.join(deferred)} DEFERRED")


def _key_conflict(error: IntegrityError) -> bool:
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == "axa_queue_unique"


def _retry_rows(using: str, statement: str, params: Any) -> list[Row] | None:
    """Run the retry statement in a savepoint; None if a concurrent writer took a key first."""
    try:
        with transaction.atomic(using=using), checked_now(using), connections[using].cursor() as cursor:
            cursor.execute(statement, params)
            return list(cursor.fetchall())
    except IntegrityError as error:
        if _key_conflict(error):
            return None
        raise


def _retry_one(jobs: models.QuerySet[Any], job_id: uuid.UUID) -> list[Row]:
    """Retry one job; if its key is taken meanwhile, report the job holding it (None once that one is gone)."""
    using = jobs.db
    holder = None
    for _ in range(3):
        rows = _retry_rows(using, dependencies.RETRY.format(candidates="WHERE q.id = %s"), [job_id])
        if rows is not None:
            return rows
        key = jobs.model._base_manager.using(using).filter(pk=job_id).values("name", "unique_key").first()
        if key is None:
            return []  # deleted meanwhile: nothing to retry
        holder = (
            jobs.model._base_manager.using(using)
            .filter(status__in=["queued", "running"], **key)
            .values_list("id", flat=True)
            .first()
        )
        if holder is not None:
            break
    return [(job_id, False, holder)]


def retry(jobs: models.QuerySet[Any]) -> RetryResult:
    """Queue the failed jobs of ``jobs`` again (JobQuerySet.retry says how)."""
    failed = jobs.filter(status="failed")
    subquery, params = failed.order_by().values("id").query.sql_with_params()
    statement = dependencies.RETRY.format(candidates=f"WHERE q.id IN ({subquery})")
    refusals: dict[uuid.UUID, str] = {}
    try:
        # Only a concurrent enqueue or retry that took a key after this statement's
        # snapshot can conflict; run again, and it sees that job as the holder.
        for _ in range(3):
            rows = _retry_rows(jobs.db, statement, params)
            if rows is not None:
                break
        else:
            # Keys keep being taken under us: one row at a time cannot loop.
            rows = [row for job_id in failed.values_list("id", flat=True) for row in _retry_one(jobs, job_id)]
    except DatabaseError as error:
        if not refused.refusal(error):
            raise
        logger.error("retry was refused (%s); retrying the jobs one at a time", refused.reason(error))
        rows = []

        def write(job_id: uuid.UUID, why: str | None) -> None:
            if why is not None:  # a retry has no "in place": the row moves back, or stays failed
                raise refused.Refused(DatabaseError(why))
            rows.extend(_retry_one(jobs, job_id))

        refusals = refused.each(list(failed.values_list("id", flat=True)), write, refused.refusal, "retry of job")
    result = RetryResult(
        sum(1 for _, retried, _ in rows if retried),
        {job_id: holder for job_id, retried, holder in rows if not retried},
        refusals,
    )
    if result:
        # The insert trigger does not fire on UPDATE; notify so workers need not wait a poll.
        with connections[jobs.db].cursor() as cursor:
            cursor.execute(sql.WAKE)
    return result


def _cancel(using: str, subquery: str, params: Any, why: str | None = None) -> int:
    with transaction.atomic(using=using), checked_now(using), connections[using].cursor() as cursor:
        if why is not None:  # one row (params): the setting names it, and is cleared after
            cursor.execute(refused.IN_PLACE_ROW, {"id": params[0]})
        cursor.execute(CANCEL.format(subquery=subquery), params)
        rows = cursor.fetchall()
        ended = [(job_id, children) for job_id, status, children, _ in rows if status == "cancelled"]
        if why is not None:
            cursor.execute(refused.NOT_IN_PLACE)
            for job_id, _ in ended:
                cursor.execute(refused.NOTE, {"id": job_id, "type": refused.REFUSED_TYPE, "message": refused.note(why)})
        dependencies.settle(cursor, [job_id for job_id, children in ended if children])
    return len(rows)


def cancel(jobs: models.QuerySet[Any]) -> int:
    """Cancel the queued and waiting jobs of ``jobs``, flag the running ones (JobQuerySet.cancel says how).

    A running job's worker is told by NOTIFY; its heartbeat relays the flag too, for
    workers that do not listen.
    """
    live = jobs.filter(status__in=["queued", "waiting", "running"])
    subquery, params = live.order_by().values("id").query.sql_with_params()
    try:
        return _cancel(jobs.db, subquery, params)
    except DatabaseError as error:
        if not refused.refusal(error):
            raise
        logger.error("cancel was refused (%s); cancelling the jobs one at a time", refused.reason(error))
    done: list[int] = []

    def write(job_id: uuid.UUID, why: str | None) -> None:
        done.append(_cancel(jobs.db, "%s", [job_id], why))

    refused.each(list(live.values_list("id", flat=True)), write, refused.refusal, "cancel of job")
    return sum(done)
