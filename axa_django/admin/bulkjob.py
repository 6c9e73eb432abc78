"""Bulk retry, cancel and delete by a job list's filter: the background job that does them, a batch per transaction.

An operation (``BulkOperation``) names a job list (Jobs, Failed jobs), its query string and
what to do. Its job, on any worker that serves the default queue, rebuilds the list's
queryset from that query string through the admin's own ChangeList (its filters and
search, a search syntax added later included), then walks the matching jobs in id order.
Each batch is one short transaction: it locks the operation's row, reads at most
``batch_size`` matching ids among the next WINDOW ids past the saved position (a range of
the primary key: no batch reads the whole table), locks those rows SKIP LOCKED (a row
another transaction holds is not waited for: it is kept and tried again at the end), does
to them what the single-row action does (``retry``, ``cancel``, the delete by id), and
saves the new position with the counts. A worker that dies mid-batch loses only that
uncommitted batch; its job runs again on another worker, as every lost worker's job does,
and goes on from the saved position: no row is done twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.apps import apps
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.sites import all_sites
from django.contrib.admin.views.main import PAGE_VAR
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.db import DatabaseError, OperationalError, connections, transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, QueryDict

from .. import conf
from ..context import JobContext
from ..models import Job
from ..models.queue import BulkOperation
from ..registry import background_job

logger = logging.getLogger("axa_django")

NAME = "axa_django.bulk_operation"
QUEUE = "default"
# Ahead of the queued jobs it may be behind: an operation confirmed during a backlog starts now.
PRIORITY = 100
# The lists an operation may start from (the job admin's model names).
LISTS = ("job", "failedjob")
# Attempts of the job: a lost connection fails an attempt; the next goes on from the position.
MAX_ATTEMPTS = 3

# A batch waits at most this long for a lock (a row's, beyond those it skipped; the operation's
# row): then it is rolled back and run again, and after TRIES such timeouts its rows go one by one.
LOCK_TIMEOUT = "500ms"
STATEMENT_TIMEOUT = "60s"
# Bitmap scans off: a batch names its rows by id, and a bitmap of the list's status (every
# failed row) ANDed with the ids' read the whole status index at each batch (1,000,000 rows
# failed: most of a batch's time); without them the rows are found through the primary key.
TIMEOUTS = (
    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
    "set_config('enable_bitmapscan', 'off', true)"
)
TRIES = 3
# Ids a batch's read spans at most, matching or not: a filter matching few rows reads the
# table in steps of this many primary key entries, never all at once.
WINDOW = 20_000
# Ids held by other transactions kept to try again at the end (more are counted skipped at
# once), the rounds they get, and the pause between rounds.
BUSY_KEPT = 1_000
BUSY_ROUNDS = 3
BUSY_PAUSE = 1.0
# 55P03: a lock not granted within lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"

# A run of the job hands the rest to a new job of its own after this many seconds (or
# LEASE_SECONDS, if shorter): a worker asked to stop (SIGTERM, the Workers page) waits for its
# running jobs, and one run of a million rows kept it for the whole operation. The new job goes
# on from the saved position.
SLICE_SECONDS = 10.0
# Seconds of pause after each second a batch took: an operation takes at most a third of the
# time it shares with the workers. At 1 (half the time) a worker draining beside a bulk retry
# at 10,000,000 jobs ran at 0.77x its speed alone on 2 cores (benchmarks/results/pg15-bulk-drains-2.txt).
PACE = 2.0

MORE, WALKED, STOPPED, CANCEL, SLICED = "more", "walked", "stopped", "cancel", "sliced"


class Contended(Exception):
    """The operation's row is held by another transaction (another run of it, a cancel being saved)."""


def targets(kind: str, jobs: QuerySet[Any]) -> QuerySet[Any]:
    """The jobs of ``jobs`` an operation of ``kind`` acts on: failed to retry, live to cancel, any to delete.

    Never the operations' own jobs: a cancel of every running job would stop itself.
    """
    jobs = jobs.exclude(name=NAME)
    if kind == BulkOperation.Kind.RETRY:
        return jobs.filter(status=Job.Status.FAILED)
    if kind == BulkOperation.Kind.CANCEL:
        live = Q(status__in=[Job.Status.QUEUED, Job.Status.WAITING])
        return jobs.filter(live | Q(status=Job.Status.RUNNING, cancel_requested=False))
    return jobs


def list_admin(site_name: str, list_name: str) -> Any:
    """The ModelAdmin of job list ``list_name`` on admin site ``site_name``; None if there is none."""
    if list_name not in LISTS:
        return None
    model = apps.get_model("axa_django", list_name)
    for site in all_sites:
        if site.name == site_name and site.is_registered(model):
            return site.get_model_admin(model)
    return None


def user_of(user_pk: str) -> Any:
    """The user an operation was started by, or AnonymousUser if that user is gone."""
    if not user_pk:
        return AnonymousUser()
    model = get_user_model()
    try:
        return model._default_manager.filter(pk=model._meta.pk.to_python(user_pk)).first() or AnonymousUser()
    except (TypeError, ValueError, ValidationError):
        return AnonymousUser()


def rebuild(op: BulkOperation) -> QuerySet[Any]:
    """The jobs ``op`` changes, read through its list's own ChangeList from the saved query string.

    Raises IncorrectLookupParameters if the list no longer takes that query, LookupError if the list is gone.
    """
    model_admin = list_admin(op.site, op.list_name)
    if model_admin is None:
        raise LookupError(f"the admin site {op.site!r} has no job list {op.list_name!r}")
    request = HttpRequest()
    request.method = "GET"
    request.GET = QueryDict(op.query, mutable=True)
    request.GET.pop(PAGE_VAR, None)
    request.user = user_of(op.user_pk)
    return targets(op.kind, model_admin.get_changelist_instance(request).queryset).order_by()


def bound(using: str) -> uuid.UUID | None:
    """The greatest job id now (one descent of each table's primary key): jobs made later are left out."""
    return Job._base_manager.using(using).order_by("-pk").values_list("pk", flat=True).first()


def lock_timed_out(error: BaseException) -> bool:
    cause = error.__cause__
    return (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) == LOCK_NOT_AVAILABLE


def act(kind: str, using: str, ids: list[uuid.UUID]) -> tuple[int, int, int]:
    """Do ``kind`` to jobs ``ids`` (locked by the caller) as the per-row actions do: (changed, key in use, refused)."""
    if not ids:
        return 0, 0, 0
    rows = Job.objects.using(using).filter(pk__in=ids)
    if kind == BulkOperation.Kind.RETRY:
        result = rows.retry()
        return int(result), len(result.skipped), len(result.refused)
    if kind == BulkOperation.Kind.CANCEL:
        return rows.cancel(), 0, 0
    _, per_model = rows.delete()
    return per_model.get(Job._meta.label, 0), 0, 0


def record(op: BulkOperation, text: str) -> None:
    """``text`` in the log and, on the operation, in the admin's history under the user who started it."""
    logger.info("%s by %s (list %s?%s): %s", op, op.started_by or "?", op.list_name, op.query, text)
    user = user_of(op.user_pk)
    if user.is_authenticated:
        LogEntry.objects.log_actions(user.pk, [op], CHANGE, change_message=text, single_object=True)


def summary(op: BulkOperation) -> str:
    """The counts of ``op`` in a sentence."""
    reasons = [
        (op.skipped_gone, "no longer matching"),
        (op.skipped_key, "unique key in use"),
        (op.skipped_refused, "refused by the database"),
        (op.skipped_busy, "held by another transaction"),
    ]
    skipped = "; ".join(f"{count:,} {why}" for count, why in reasons if count)
    counts = f"{op.matched:,} matched, {op.changed:,} changed, {op.skipped:,} skipped"
    return counts + (f" ({skipped})" if skipped else "")


class Runner:
    """One run of an operation's job: the walk in batches, then the rows held by others tried again."""

    def __init__(self, op_id: int, context: JobContext | None) -> None:
        self.op_id = op_id
        self.context = context
        self.using = conf.queue_database()
        self.batch_size = 1
        # Rows to go one at a time after a batch timed out on a lock, until past that batch.
        self.single = 0

    def run(self) -> dict[str, Any]:
        op = self.begin()
        if op is None:
            return {"operation": self.op_id, "ran": False}
        try:
            try:
                # Jobs made after the confirmation are left out, by the database clock (an id
                # bound alone let them in: the Rust crate's version 4 ids sort anywhere).
                jobs = rebuild(op).filter(created_at__lte=op.created_at)
            except (IncorrectLookupParameters, LookupError) as error:
                self.end(BulkOperation.Status.FAILED, error=f"the list's filter cannot be read again: {error}")
                return {"operation": self.op_id, "ran": False}
            state = self.walk(jobs)
            if state == SLICED:
                self.hand_on()
                return {"operation": self.op_id, "handed_on": True}
            if state == WALKED:
                state = self.retry_busy(jobs)
            if state == WALKED:
                self.end(BulkOperation.Status.DONE)
        except Exception as error:
            attempt = self.context.attempt if self.context is not None else MAX_ATTEMPTS
            last = attempt >= MAX_ATTEMPTS
            try:
                self.end(BulkOperation.Status.FAILED if last else None, error=f"{type(error).__name__}: {error}")
            except DatabaseError:
                logger.exception("%s: its failure could not be saved", self.op_id)
            raise
        op = BulkOperation.objects.using(self.using).get(pk=self.op_id)
        return {"operation": op.pk, "status": op.status, "matched": op.matched, "changed": op.changed}

    def begin(self) -> BulkOperation | None:
        """Mark the operation running (or go on with one a lost worker left running); None if it is over."""
        with transaction.atomic(using=self.using):
            op = BulkOperation.objects.using(self.using).select_for_update().filter(pk=self.op_id).first()
            if op is None or op.status not in (BulkOperation.Status.QUEUED, BulkOperation.Status.RUNNING):
                return None
            resumed = op.status == BulkOperation.Status.RUNNING and not self.handed_on(op)
            op.status = BulkOperation.Status.RUNNING
            op.started_at = op.started_at or Now()
            op.updated_at = Now()
            op.save(update_fields=["status", "started_at", "updated_at"])
            op.refresh_from_db()
        self.batch_size = op.batch_size
        if resumed:
            record(op, f"resumed after id {op.position} ({summary(op)} so far)")
        return op

    def handed_on(self, op: BulkOperation) -> bool:
        """Whether this run is the job the last run handed the rest to (not one run again after a loss)."""
        context = self.context
        if context is None or op.job_id != context.job_id or context.attempt > 1:
            return False
        return not Job._base_manager.using(self.using).filter(pk=context.job_id, losses__gt=0).exists()

    def end(self, status: str | None, error: str = "") -> None:
        """Close the operation with ``status`` (None: leave it running, saying ``error``), logged and recorded."""
        with transaction.atomic(using=self.using):
            op = BulkOperation.objects.using(self.using).select_for_update().get(pk=self.op_id)
            if status is not None and op.status in (BulkOperation.Status.QUEUED, BulkOperation.Status.RUNNING):
                op.status = status
                op.finished_at = Now()
            op.error = error
            op.updated_at = Now()
            op.save(update_fields=["status", "finished_at", "error", "updated_at"])
            op.refresh_from_db()
        if status is not None:
            record(op, f"{op.status}: {summary(op)}" + (f"; {error}" if error else ""))
        elif error:
            logger.warning("%s: an attempt failed (%s); the next goes on from id %s", op, error, op.position)

    def stopping(self, op: BulkOperation) -> bool:
        return op.cancel_requested or (self.context is not None and self.context.is_cancelled())

    def locked_op(self) -> BulkOperation:
        """The operation's row, locked for this batch, under the batch's timeouts."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(TIMEOUTS, [LOCK_TIMEOUT, STATEMENT_TIMEOUT])
        try:
            with transaction.atomic(using=self.using):
                return BulkOperation.objects.using(self.using).select_for_update().get(pk=self.op_id)
        except OperationalError as error:
            if lock_timed_out(error):
                raise Contended from error
            raise

    def hand_on(self) -> None:
        """Enqueue the job that goes on from the saved position, unless the operation ended meanwhile."""
        with transaction.atomic(using=self.using):
            op = BulkOperation.objects.using(self.using).select_for_update().get(pk=self.op_id)
            if op.status == BulkOperation.Status.RUNNING:
                op.job_id = bulk_operation.perform_later(operation=op.pk).pk
                op.save(update_fields=["job_id"])

    def walk(self, jobs: QuerySet[Any]) -> str:
        """Batches from the saved position to the bound; WALKED at the end, STOPPED if cancelled or ended
        elsewhere, SLICED after SLICE_SECONDS (the rest is a new job's)."""
        timeouts, held = 0, False
        ends = time.monotonic() + min(SLICE_SECONDS, float(conf.get("LEASE_SECONDS")))
        while True:
            began = time.monotonic()
            try:
                state, pause = self.batch(jobs, held)
                timeouts, held = 0, False
            except Contended:
                time.sleep(0.1)
                continue
            except OperationalError as error:
                if not lock_timed_out(error):
                    raise
                timeouts += 1
                if timeouts >= TRIES:
                    timeouts = 0
                    if self.single:
                        held = True  # this row alone timed out each time: kept for the end
                    else:
                        self.single = self.batch_size  # that batch's rows one at a time
                continue
            if state == CANCEL:
                self.end(BulkOperation.Status.CANCELLED)
                return STOPPED
            if state != MORE:
                return state
            if time.monotonic() >= ends:
                return SLICED
            if pause:
                # Never shorter than PACE times the batch (500 ms alone was half a batch of 1,000
                # retries at 10,000,000 jobs, and a worker draining beside it ran at 0.69x its speed),
                # but never past the slice's end: a worker asked to stop waits for the slice.
                now = time.monotonic()
                wait = max(pause, PACE * (now - began))
                if now + wait >= ends:
                    time.sleep(max(ends - now, 0.0))
                    return SLICED
                time.sleep(wait)

    def batch(self, jobs: QuerySet[Any], held: bool = False) -> tuple[str, float]:
        """One batch in one transaction; ``held``: only the next row, not acted on but kept to try at the end."""
        with transaction.atomic(using=self.using):
            op = self.locked_op()
            if op.status != BulkOperation.Status.RUNNING:
                return STOPPED, 0.0
            if self.stopping(op):
                return CANCEL, 0.0
            if op.bound is None:  # no job at all when it was confirmed
                return WALKED, 0.0
            size = 1 if held or self.single else op.batch_size
            end = self.window_end(op)
            read = jobs.filter(pk__lte=end)
            if op.position is not None:
                read = read.filter(pk__gt=op.position)
            ids = list(read.order_by("pk").values_list("pk", flat=True)[:size])
            position = ids[-1] if len(ids) == size else end
            if held:
                self.keep_busy(op, ids)
            else:
                self.apply(op, jobs, ids)
            self.single = max(self.single - len(ids), 0) if ids else 0
            op.position = position
            op.matched += len(ids)
            op.batches += 1
            op.updated_at = Now()
            op.save()
            return (WALKED if position == op.bound else MORE), op.pause_ms / 1000

    def window_end(self, op: BulkOperation) -> uuid.UUID | None:
        """The id WINDOW ids past the position (index entries only), or the bound if fewer are left."""
        after = Job._base_manager.using(self.using).filter(pk__lte=op.bound)
        if op.position is not None:
            after = after.filter(pk__gt=op.position)
        found = list(after.order_by("pk").values_list("pk", flat=True)[WINDOW - 1 : WINDOW])
        return found[0] if found else op.bound

    def apply(self, op: BulkOperation, jobs: QuerySet[Any], ids: list[uuid.UUID]) -> None:
        """Lock the rows of ``ids`` that still match (passing over those others hold), act on them, count.

        The rows held by others that still match are kept in ``op.busy`` (up to BUSY_KEPT), to try at the end.
        """
        if not ids:
            return
        mine = jobs.filter(pk__in=ids).select_for_update(skip_locked=True, of=("self",)).order_by("pk")
        locked = list(mine.values_list("pk", flat=True))
        missing = set(ids) - set(locked)
        held = sorted(jobs.filter(pk__in=missing).values_list("pk", flat=True)) if missing else []
        changed, key, refused = act(op.kind, self.using, locked)
        op.changed += changed
        op.skipped_key += key
        op.skipped_refused += refused
        op.skipped_gone += len(ids) - len(held) - changed - key - refused
        self.keep_busy(op, held)

    def keep_busy(self, op: BulkOperation, ids: list[uuid.UUID]) -> None:
        kept = [str(i) for i in ids][: max(BUSY_KEPT - len(op.busy), 0)]
        op.busy = [*op.busy, *kept]
        op.skipped_busy += len(ids) - len(kept)

    def retry_busy(self, jobs: QuerySet[Any]) -> str:
        """Try the rows held by others again, BUSY_ROUNDS times; those still held are counted skipped."""
        for round_ in range(BUSY_ROUNDS):
            last = round_ == BUSY_ROUNDS - 1
            try:
                state = self.busy_round(jobs, last)
            except Contended:
                state = MORE
            except OperationalError as error:
                if not lock_timed_out(error):
                    raise
                state = self.busy_round(jobs, last, timed_out=True) if last else MORE
            if state == CANCEL:
                self.end(BulkOperation.Status.CANCELLED)
                return STOPPED
            if state != MORE:
                return state
            time.sleep(BUSY_PAUSE)
        return WALKED

    def busy_round(self, jobs: QuerySet[Any], last: bool, timed_out: bool = False) -> str:
        """One try of the rows kept in ``busy``; on the ``last`` one, those still held are counted skipped."""
        with transaction.atomic(using=self.using):
            op = self.locked_op()
            if op.status != BulkOperation.Status.RUNNING:
                return STOPPED
            if self.stopping(op):
                return CANCEL
            ids = [uuid.UUID(i) for i in op.busy]
            if not ids:
                return WALKED
            if not timed_out:  # else they stay as they are, all held
                op.busy = []
                self.apply(op, jobs, ids)
            if last:
                op.skipped_busy += len(op.busy)
                op.busy = []
            op.updated_at = Now()
            op.save()
            return MORE if op.busy else WALKED


@background_job(name=NAME, queue=QUEUE, priority=PRIORITY, max_attempts=MAX_ATTEMPTS, takes_context=True)
def bulk_operation(context: JobContext, operation: int) -> dict[str, Any]:
    """Run bulk operation ``operation`` to its end (or until cancelled), from its saved position."""
    return Runner(operation, context).run()
