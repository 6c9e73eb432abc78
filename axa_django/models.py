"""The axa_queue table (wire-compatible with the Rust crate axa) and the workers table."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connections, models
from django.db.models.functions import Now

from . import sql


class JobQuerySet(models.QuerySet["Job"]):
    """Queries over jobs; status changes are guarded on the status they leave."""

    def ready(self) -> JobQuerySet:
        """Jobs a worker may claim now."""
        return self.filter(status=Job.Status.QUEUED, run_at__lte=Now())

    def retry(self) -> int:
        """Queue failed jobs again to run now, waking idle workers; return how many changed."""
        changed = self.filter(status=Job.Status.FAILED).update(
            status=Job.Status.QUEUED,
            run_at=Now(),
            started_at=None,
            finished_at=None,
            worker_id=None,
            attempts=0,
            updated_at=Now(),
        )
        if changed:
            # The insert trigger does not fire on UPDATE; notify so workers need not wait a poll.
            with connections[self.db].cursor() as cursor:
                cursor.execute(sql.WAKE)
        return changed

    def cancel(self) -> int:
        """Cancel queued jobs and ask running ones to stop; return how many changed."""
        queued = self.filter(status=Job.Status.QUEUED).update(
            status=Job.Status.CANCELLED, finished_at=Now(), updated_at=Now()
        )
        # Flag running jobs and NOTIFY their workers in one statement; the worker's
        # heartbeat relays the flag too, for workers that do not listen.
        subquery, params = (
            self.filter(status=Job.Status.RUNNING, cancel_requested=False)
            .order_by()
            .values("id")
            .query.sql_with_params()
        )
        with connections[self.db].cursor() as cursor:
            cursor.execute(
                "WITH flagged AS (UPDATE axa_queue SET cancel_requested = true, updated_at = now() "
                f"WHERE id IN ({subquery}) AND status = 'running' AND NOT cancel_requested RETURNING id) "
                "SELECT pg_notify('axa_cancel', id::text) FROM flagged",
                params,
            )
            running = len(cursor.fetchall())
        return queued + running


class Job(models.Model):
    """One job: a row of ``axa_queue``."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    # The seed's columns, with its defaults.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.TextField()
    args = models.JSONField(default=dict)
    status = models.TextField(choices=Status, default=Status.QUEUED, db_default=Status.QUEUED)
    error = models.TextField(null=True, blank=True)
    run_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # Beyond the seed: each has a database default or is nullable, so the seed's
    # statements still run against this table.
    queue = models.TextField(db_default="default")
    priority = models.IntegerField(db_default=0)
    attempts = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(null=True, blank=True)
    worker_id = models.UUIDField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(db_default=models.Value([], models.JSONField()))
    result = models.JSONField(null=True, blank=True)
    unique_key = models.TextField(null=True, blank=True)
    cancel_requested = models.BooleanField(db_default=False)
    backend = models.TextField(null=True, blank=True)

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
            # Serves the claim: per name, highest priority then oldest run_at.
            models.Index(
                "name",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim",
                condition=models.Q(status="queued"),
            ),
            # Serves the claim of django.tasks rows: per backend alias, best first.
            models.Index(
                "backend",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_task",
                condition=models.Q(status="queued", backend__isnull=False),
            ),
            # Serve the claim of a --queue worker: per queue and name (or backend alias),
            # so rows waiting in other queues are never walked.
            models.Index(
                "queue",
                "name",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_queue",
                condition=models.Q(status="queued"),
            ),
            models.Index(
                "queue",
                "backend",
                models.F("priority").desc(),
                "run_at",
                name="axa_queue_claim_task_queue",
                condition=models.Q(status="queued", backend__isnull=False),
            ),
            models.Index(fields=["worker_id"], name="axa_queue_running", condition=models.Q(status="running")),
            models.Index(fields=["status", "-created_at"], name="axa_queue_status"),
            # Serves the admin's job list, newest first, without sorting the whole table.
            models.Index(fields=["-created_at"], name="axa_queue_created"),
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
        """Queue this failed job again; False if it was no longer failed."""
        changed = Job.objects.filter(pk=self.pk).retry() == 1
        self.refresh_from_db()
        return changed

    def cancel(self) -> bool:
        """Cancel this job if queued, or ask its worker to stop it if running."""
        changed = Job.objects.filter(pk=self.pk).cancel() == 1
        self.refresh_from_db()
        return changed

    @property
    def duration(self) -> Any:
        """Time from start to finish, or None."""
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None


class Worker(models.Model):
    """A live worker process; its heartbeat is the lease on the jobs it runs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.TextField()
    pid = models.IntegerField()
    concurrency = models.IntegerField()
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "axa_worker"
        ordering = ["started_at"]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class Schedule(models.Model):
    """The last enqueued occurrence of a periodic job; workers advance it with compare-and-set."""

    name = models.TextField(primary_key=True)
    last_run = models.DateTimeField()

    class Meta:
        db_table = "axa_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (last run {self.last_run:%Y-%m-%d %H:%M:%S%z})"


# The admin's proxy models must load with the app's models, or migrations would see them vanish.
from . import proxies  # noqa: E402, F401
