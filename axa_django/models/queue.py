"""The queue's other tables: workers, schedules, paused and limited queues, rate buckets, kept hours."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models.functions import Now


class Worker(models.Model):
    """A live worker process; its heartbeat is the lease on the jobs it runs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.TextField()
    pid = models.IntegerField()
    concurrency = models.IntegerField()
    queues = models.JSONField(default=list)
    # The job names and django.tasks backend aliases this worker claims.
    names = models.JSONField(db_default=models.Value([], models.JSONField()))
    backends = models.JSONField(db_default=models.Value([], models.JSONField()))
    started_at = models.DateTimeField(db_default=Now())
    heartbeat_at = models.DateTimeField(db_default=Now())
    # LEASE_SECONDS of this worker: its heartbeat is fresh for so long (the schema's
    # axa_queue_requeue guard reads it; a Rust service sharing the table knows no lease).
    lease_seconds = models.FloatField(db_default=30.0)
    # Who asked this worker to stop from the admin, and when: its heartbeat reads them
    # back on the connection it already holds and the worker stops as on SIGTERM.
    stop_requested_by = models.TextField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "axa_worker"
        ordering = ["started_at"]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"


class Schedule(models.Model):
    """The last enqueued occurrence of a periodic job; workers advance it with compare-and-set."""

    name = models.TextField(primary_key=True)
    last_run = models.DateTimeField()
    # Off (the admin's periodic jobs page): workers enqueue none of its occurrences.
    enabled = models.BooleanField(db_default=True)
    # The job of the last occurrence enqueued: the page's "last run", read by its id
    # (the history has no index by name).
    last_job_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "axa_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} (last run {self.last_run:%Y-%m-%d %H:%M:%S%z})"


class QueuePause(models.Model):
    """A paused queue: while its row exists, no worker of this app claims the queue's jobs."""

    queue = models.TextField(primary_key=True)
    reason = models.TextField(blank=True, db_default="")
    paused_by = models.TextField(blank=True, db_default="")
    paused_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "axa_paused_queue"
        ordering = ["queue"]
        verbose_name = "paused queue"
        verbose_name_plural = "paused queues"
        default_permissions = ("view",)
        permissions = [("pause_queue", "Can pause and resume queues")]

    def __str__(self) -> str:
        return f"{self.queue} (paused)"


class QueueLimit(models.Model):
    """A queue's fleet-wide limit: at most ``max_running`` of its jobs run at once, across all workers."""

    queue = models.TextField(primary_key=True)
    max_running = models.IntegerField()
    set_by = models.TextField(blank=True, db_default="")
    set_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "axa_queue_limit"
        ordering = ["queue"]
        verbose_name = "queue limit"
        verbose_name_plural = "queue limits"
        default_permissions = ("view",)
        constraints = [models.CheckConstraint(condition=models.Q(max_running__gt=0), name="axa_queue_limit_positive")]

    def __str__(self) -> str:
        return f"{self.queue} (at most {self.max_running} running)"


class RateBucket(models.Model):
    """A rate-limited job's (name, key): the time its next start is due (a GCRA's theoretical arrival time)."""

    pk = models.CompositePrimaryKey("name", "key")
    name = models.TextField()
    key = models.TextField()
    tat = models.DateTimeField()

    class Meta:
        db_table = "axa_rate_bucket"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.name} [{self.key}] next start at {self.tat:%Y-%m-%d %H:%M:%S.%f%z}"


class FinishedHour(models.Model):
    """Jobs that finished in one past hour (UTC), counted once after it ended: the dashboard chart's past."""

    hour = models.DateTimeField(primary_key=True)
    completed = models.BigIntegerField()
    failed = models.BigIntegerField()

    class Meta:
        db_table = "axa_finished_hour"
        ordering = ["hour"]
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00%z}: {self.completed} completed, {self.failed} failed"


class PeriodicJob(Schedule):
    """The periodic jobs page's admin entry: every cron entry, its last and next run, enable and disable."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "periodic job"
        verbose_name_plural = "periodic jobs"
        # Access is Schedule's (view_schedule, change_schedule) or Job's view, not new permissions.
        default_permissions = ()


# The admin's Queues and Workers pages (admin/queuepage.py, admin/workerpage.py): proxies,
# so that each has an entry in the admin's index and its changes a place in its history.
class Queue(QueuePause):
    """The Queues page's admin entry: every queue with its figures, pause and limit."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "queue"
        verbose_name_plural = "queues"
        # Seeing needs view_job (or the paused queues' view); acting needs pause_queue.
        default_permissions = ()

    def __str__(self) -> str:
        return self.queue  # the queue itself, paused or not (the admin's history names it so)


class LiveWorker(Worker):
    """The Workers page's admin entry: every live worker, what it runs, and a graceful stop."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "worker"
        verbose_name_plural = "workers"
        default_permissions = ()
        permissions = [("stop_worker", "Can ask a worker to stop")]


class BulkOperation(models.Model):
    """A retry, cancel or delete of every job a list's filter matches, run by a worker in batches (admin/bulkjob.py)."""

    class Kind(models.TextChoices):
        RETRY = "retry"
        CANCEL = "cancel"
        DELETE = "delete"

    class Status(models.TextChoices):
        QUEUED = "queued"  # no worker has started it yet
        RUNNING = "running"
        DONE = "done"
        CANCELLED = "cancelled"
        FAILED = "failed"

    kind = models.TextField(choices=Kind)
    # The list it was started from: its admin site, its model (job, failedjob) and query
    # string, read again by every run of the job through the list's own filters and search.
    site = models.TextField(db_default="admin")
    list_name = models.TextField()
    query = models.TextField(blank=True, db_default="")
    user_pk = models.TextField(blank=True, db_default="")
    started_by = models.TextField(blank=True, db_default="")
    status = models.TextField(choices=Status, db_default=Status.QUEUED)
    # The count shown on the confirmation page (the planner's estimate when large).
    estimate = models.BigIntegerField(db_default=0)
    estimated = models.BooleanField(db_default=False)
    batch_size = models.IntegerField(db_default=1000)
    pause_ms = models.IntegerField(db_default=500)
    # The greatest job id when it was confirmed (jobs made later are left out), and the
    # greatest its batches have passed: a run after a lost worker starts from there.
    bound = models.UUIDField(null=True, blank=True)
    position = models.UUIDField(null=True, blank=True)
    matched = models.BigIntegerField(db_default=0)
    changed = models.BigIntegerField(db_default=0)
    # Skipped, by why: no longer matching when its batch locked it (changed or deleted
    # meanwhile), its unique key in use, refused by the database, held by another
    # transaction until the end. ``busy`` holds the ids held so far, tried again at the end.
    skipped_gone = models.BigIntegerField(db_default=0)
    skipped_key = models.BigIntegerField(db_default=0)
    skipped_refused = models.BigIntegerField(db_default=0)
    skipped_busy = models.BigIntegerField(db_default=0)
    busy = models.JSONField(db_default=models.Value([], models.JSONField()))
    batches = models.IntegerField(db_default=0)
    job_id = models.UUIDField(null=True, blank=True)
    cancel_requested = models.BooleanField(db_default=False)
    cancelled_by = models.TextField(blank=True, db_default="")
    error = models.TextField(blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "axa_bulk_operation"
        ordering = ["-id"]
        verbose_name = "bulk operation"
        verbose_name_plural = "bulk operations"
        # Governed by Job's permissions (view_job to see, the kind's own to start or cancel).
        default_permissions = ()

    def __str__(self) -> str:
        return f"bulk {self.kind} #{self.pk} ({self.status})"

    @property
    def skipped(self) -> int:
        """Jobs matched and left as they were, for any reason."""
        return self.skipped_gone + self.skipped_key + self.skipped_refused + self.skipped_busy
