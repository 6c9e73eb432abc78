"""The axa_queue table (wire-compatible with the Rust crate axa): Job, its queryset, and the admin's proxies."""

from __future__ import annotations

import datetime
from typing import Any

from django.db import models
from django.db.models.functions import Now
from psycopg.types.json import Jsonb

from ..ids import uuid7
from . import changes
from .changes import RetryResult
from .moves import MovingQuerySet, StaysPut, track_fetches


class JobQuerySet(MovingQuerySet["Job"]):
    """Queries over jobs; status changes are guarded on the status they leave."""

    def ready(self) -> JobQuerySet:
        """Jobs a worker may claim now."""
        return self.filter(status=Job.Status.QUEUED, run_at__lte=Now())

    def retry(self) -> RetryResult:
        """Queue failed jobs again to run now, waking idle workers; return how many changed.

        A job whose unique key another queued or running job holds (or a job retried
        with it, the latest failure first) stays failed and is listed in ``skipped``; one
        the database refuses to queue again (a user's trigger) in ``refused``.
        """
        return changes.retry(self)

    def cancel(self) -> int:
        """Cancel queued and waiting jobs (and the descendants waiting on them) and ask running ones to stop.

        Return how many of these jobs changed. A job whose move into the history the
        database refuses (a user's foreign key or trigger) is cancelled in place.
        """
        return changes.cancel(self)


class Undecodable(str):
    """JSON read from a row that Python cannot hold (nested too deeply, a 5,000-digit number): its text, kept as is."""


class RowJSONField(models.JSONField):
    """A JSONField that loads any row: JSON Python cannot decode comes back as ``Undecodable`` text.

    Rows written by other producers (a Rust service, psql) may hold such values; the
    admin must still show them, and saving the row writes the same text back.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except (RecursionError, ValueError):
            return Undecodable(value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, Undecodable):
            return Jsonb(str(value), dumps=str)
        return super().get_db_prep_value(value, connection, prepared)

    def deconstruct(self) -> Any:
        # Only loading differs: migrations see a plain JSONField.
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class OutOfRange(datetime.datetime):
    """A time read from a row that Python cannot hold (before year 1, after 9999, infinity): the nearest it can."""


# The first and last times Python holds, in the session's time zone, in which psycopg
# loads them (UTC under USE_TZ, else the database's TIME_ZONE).
_FIRST = "'0001-01-01 00:00:00'::timestamp AT TIME ZONE current_setting('TimeZone')"
_LAST = "'9999-12-31 23:59:59.999999'::timestamp AT TIME ZONE current_setting('TimeZone')"


class RowDateTimeField(models.DateTimeField):
    """A DateTimeField that loads any row: a time Python cannot hold comes back as ``OutOfRange``, the nearest it can.

    Rows written by other producers may hold '-infinity' or a date BC; loading one
    failed the whole query, and so the admin's job list. Saving such a time back
    raises instead of writing the nearest time in its place.
    """

    def select_format(self, compiler: Any, sql: str, params: Any) -> Any:
        sql, params = super().select_format(compiler, sql, params)
        clamped = f"CASE WHEN {sql} < {_FIRST} THEN {_FIRST} WHEN {sql} > {_LAST} THEN {_LAST} ELSE {sql} END"
        return clamped, (*params, *params, *params)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is not None and value.replace(tzinfo=None) in (datetime.datetime.min, datetime.datetime.max):
            return OutOfRange(*value.timetuple()[:6], value.microsecond, tzinfo=value.tzinfo)
        return value

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, OutOfRange):
            raise ValueError(
                f"{self.name} was read as {value.isoformat()}, the nearest time Python holds to the row's own "
                "(before year 1 or after 9999); saving would write that in its place: set it with "
                "QuerySet.update() or SQL instead"
            )
        return super().get_db_prep_value(value, connection, prepared)

    def deconstruct(self) -> Any:
        # Only loading differs: migrations see a plain DateTimeField.
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.DateTimeField", args, kwargs


# Queued, said so that only the claim indexes match it (see Job.Meta.indexes).
QUEUED = models.Q(status__gte="queued", status__lte="queued")


class Job(StaysPut):
    """One job: a row of ``axa_queue`` (or of a history table, once it finished)."""

    class Status(models.TextChoices):
        WAITING = "waiting"
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    # The seed's columns, with its defaults.
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.TextField()
    args = RowJSONField(default=dict)
    status = models.TextField(choices=Status, default=Status.QUEUED, db_default=Status.QUEUED)
    error = models.TextField(null=True, blank=True)
    run_at = RowDateTimeField(db_default=Now())
    started_at = RowDateTimeField(null=True, blank=True)
    created_at = RowDateTimeField(db_default=Now())
    updated_at = RowDateTimeField(db_default=Now())
    # Beyond the seed: each has a database default or is nullable, so the seed's
    # statements still run against this table.
    queue = models.TextField(db_default="default")
    priority = models.IntegerField(db_default=0)
    attempts = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(null=True, blank=True)
    # Times a worker died while running the job (apart from attempts: a loss is not the
    # job's own error), and how many it may take before it fails (None: MAX_LOSSES).
    losses = models.IntegerField(db_default=0)
    max_losses = models.IntegerField(null=True, blank=True)
    worker_id = models.UUIDField(null=True, blank=True)
    finished_at = RowDateTimeField(null=True, blank=True)
    errors = RowJSONField(db_default=models.Value([], models.JSONField()))
    result = RowJSONField(null=True, blank=True)
    unique_key = models.TextField(null=True, blank=True)
    cancel_requested = models.BooleanField(db_default=False)
    backend = models.TextField(null=True, blank=True)
    # Flow control: seconds an attempt may run (None: the job's own default, else no
    # limit), and the keys that group rows under the job's concurrency and rate limits.
    timeout = models.FloatField(null=True, blank=True)
    concurrency_key = models.TextField(null=True, blank=True)
    rate_key = models.TextField(null=True, blank=True)
    # Workflows (dependencies.py): parents not yet finished, whether any job names this
    # one in after=, what to do when a parent fails (NULL: cancel), and the group.
    pending_parents = models.IntegerField(db_default=0)
    has_children = models.BooleanField(db_default=False)
    on_parent_failure = models.TextField(null=True, blank=True)
    workflow_id = models.UUIDField(null=True, blank=True)
    # The W3C trace context (traceparent, tracestate) the job was enqueued under; written
    # and read only by axa_django.ops.tracing.
    trace_context = RowJSONField(null=True, blank=True, editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "axa_queue"
        ordering = ["-created_at"]
        permissions = [
            ("retry_job", "Can retry job"),
            ("cancel_job", "Can cancel job"),
        ]
        indexes = [
            # The seed's ready index, kept under its name.
            models.Index(fields=["run_at"], name="axa_queue_ready", condition=models.Q(status="queued")),
            # The claim indexes say "queued" as a range (status BETWEEN 'queued' AND 'queued',
            # as the claims' walks do), which the seed's "status = 'queued'" does not imply:
            # so no claim can be planned over axa_queue_ready (the seed's, kept for its own
            # CLAIM), whatever the statistics say. Over it, a claim walked every ready row
            # of every name from the oldest, dead index entries included, and sorted them.
            # Serve the plain claim: every ready row, highest priority then oldest run_at,
            # walked in that order whatever names it holds (sql/claims.py), and per queue
            # for a --queue worker. "queue IS NOT NULL" (true of every row) follows from a
            # --queue walk's "queue = x" but not from an all-queues walk: with statistics
            # left from many priorities and both indexes fresh (a TRUNCATE), PostgreSQL 15
            # planned the all-queues walk over the queue index and sorted it.
            models.Index(models.F("priority").desc(), "run_at", name="axa_queue_claim_all", condition=QUEUED),
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_all_queue",
                condition=QUEUED & models.Q(queue__isnull=False),
            ),
            # Serves the limited claims and the looks per name: per name, highest priority then
            # oldest run_at. "name IS NOT NULL" (true of every row) follows from any test of
            # name with an operator (name = x, name >= '') but the plain walk's (sql.SERVES):
            # on PostgreSQL 18 a skip scan of this index, sorted, tied with
            # axa_queue_claim_all on a small table, and a worker kept that plan as the queue grew.
            models.Index(
                "name",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim",
                condition=QUEUED & models.Q(name__isnull=False),
            ),
            # Serves the claim of django.tasks rows: per backend alias, best first.
            models.Index(
                "backend",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_task",
                condition=QUEUED & models.Q(backend__isnull=False),
            ),
            # Serve the claim of a --queue worker: per queue and name (or backend alias),
            # so rows waiting in other queues are never walked.
            models.Index(
                "queue",
                "name",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_queue",
                condition=QUEUED & models.Q(name__isnull=False),
            ),
            models.Index(
                "queue",
                "backend",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_task_queue",
                condition=QUEUED & models.Q(backend__isnull=False),
            ),
            models.Index(fields=["worker_id"], name="axa_queue_running", condition=models.Q(status="running")),
            # The admin's lists of the rarer statuses (waiting, failed, cancelled, and any a
            # foreign writer uses). Queued rows are left out: any index led by status serves
            # the claims' "status BETWEEN 'queued' AND 'queued'" too, and on some statistics a
            # claim took this one and sorted every queued row. Running and completed rows are
            # left out because every claim and every finish would write an entry (two of the
            # fourteen a job costs); their lists walk axa_queue_running and axa_queue_created.
            models.Index(
                fields=["status", "-created_at"],
                name="axa_queue_status",
                condition=~models.Q(status__in=["queued", "running", "completed"]),
            ),
            # Serves the admin's job list, newest first, without sorting the whole table.
            models.Index(fields=["-created_at"], name="axa_queue_created"),
            # Serves the failed list, the latest failure first (its order, id included):
            # with a big history it sorted every failed row for each page.
            models.Index(
                models.F("finished_at").desc(),
                models.F("id").desc(),
                name="axa_queue_failed",
                condition=models.Q(status="failed"),
            ),
            # Jobs with a concurrency limit: their (name, key) pairs and each pair's ready
            # rows, then each pair's running rows (both only rows that have a key).
            models.Index(
                "name",
                "concurrency_key",
                models.OrderBy(models.F("priority"), descending=True),
                "run_at",
                name="axa_queue_claim_limited",
                condition=models.Q(status="queued", concurrency_key__isnull=False),
            ),
            models.Index(
                fields=["name", "concurrency_key"],
                name="axa_queue_limited_running",
                condition=models.Q(status="running", concurrency_key__isnull=False),
            ),
            # Jobs with a rate limit: their (name, key) pairs and each pair's ready rows.
            models.Index(
                "name",
                "rate_key",
                models.OrderBy(models.F("priority"), descending=True),
                "run_at",
                name="axa_queue_claim_rated",
                condition=models.Q(status="queued", rate_key__isnull=False),
            ),
            models.Index(
                fields=["workflow_id"], name="axa_queue_workflow", condition=models.Q(workflow_id__isnull=False)
            ),
            # Rows with workflow edges, found in a history table about to be dropped
            # (history.LINKED) without reading the whole table.
            models.Index(
                fields=["id"],
                name="axa_queue_linked",
                condition=models.Q(has_children=True) | models.Q(on_parent_failure__isnull=False),
            ),
            # Serve the health figures (jobhealth, metrics, the live dashboard): queued rows
            # per queue oldest first, and rows finished in the last minutes. "attempts >= 0"
            # is in no claim, so the planner cannot take this index for one (it would
            # filter other names' rows instead of walking axa_queue_claim_queue).
            models.Index(
                fields=["queue", "run_at"],
                name="axa_queue_ready_queue",
                condition=models.Q(status="queued", attempts__gte=0),
            ),
            models.Index(
                fields=["finished_at"], name="axa_queue_finished", condition=models.Q(finished_at__isnull=False)
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["name", "unique_key"],
                name="axa_queue_unique",
                condition=models.Q(unique_key__isnull=False, status__in=["queued", "running"]),
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status}) {self.id}"

    def retry(self) -> bool:
        """Queue this failed job again; False if it was no longer failed or another live job holds its unique key."""
        changed = Job.objects.filter(pk=self.pk).retry() == 1
        self.refresh_from_db()
        return changed

    def cancel(self) -> bool:
        """Cancel this job (and its descendants) if queued or waiting, or ask its worker to stop it if running."""
        changed = Job.objects.filter(pk=self.pk).cancel() == 1
        self.refresh_from_db()
        return changed

    @property
    def duration(self) -> Any:
        """Time from start to finish, or None."""
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None


track_fetches(Job)


# The admin's own index entries (Failed jobs, the Dashboard): proxies, so they load with the
# app's models and migrations see them.
class FailedJob(Job):
    """Jobs whose last attempt failed and that have no attempts left."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "failed job"
        verbose_name_plural = "failed jobs"
        # Access is governed by Job's permissions (view_job, retry_job, ...), not new ones.
        default_permissions = ()


class QueueDashboard(Job):
    """The queue dashboard's admin entry; it lists no rows of its own."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()
