"""The app's tables as one initial migration (0.1.0 was never installed, so the history is squashed).

Creates axa_worker, axa_queue (with every claim/admin index and the unique-key
constraint), axa_schedule, the admin's proxy models, the insert NOTIFY trigger and
the storage parameters. Column order follows the older chain it replaces.
"""

import uuid

import django.db.models.functions.datetime
from django.db import migrations, models

# An insert from any producer (this app, a Rust service, psql) wakes idle workers.
# FOR EACH STATEMENT sends one notification per INSERT however many rows it wrote,
# and PostgreSQL delivers it at commit, so a rolled-back enqueue wakes nobody.
NOTIFY_TRIGGER = """
CREATE FUNCTION axa_queue_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('axa_queue', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_queue_notify AFTER INSERT ON axa_queue
    FOR EACH STATEMENT EXECUTE FUNCTION axa_queue_notify();
"""
DROP_NOTIFY_TRIGGER = """
DROP TRIGGER IF EXISTS axa_queue_notify ON axa_queue;
DROP FUNCTION IF EXISTS axa_queue_notify();
"""

# Every claim and finish rewrites the row: leave room on each page for HOT updates,
# and vacuum this small, hot table far sooner than the 20% default.
STORAGE = """
ALTER TABLE axa_queue SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE axa_worker SET (fillfactor = 50);
"""
RESET_STORAGE = """
ALTER TABLE axa_queue RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE axa_worker RESET (fillfactor);
"""


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("hostname", models.TextField()),
                ("pid", models.IntegerField()),
                ("concurrency", models.IntegerField()),
                ("queues", models.JSONField(default=list)),
                ("started_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("heartbeat_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("backends", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("names", models.JSONField(db_default=models.Value([], models.JSONField()))),
            ],
            options={
                "db_table": "axa_worker",
                "ordering": ["started_at"],
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("name", models.TextField()),
                ("args", models.JSONField(default=dict)),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        db_default="queued",
                        default="queued",
                    ),
                ),
                ("error", models.TextField(blank=True, null=True)),
                ("run_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("queue", models.TextField(db_default="default")),
                ("priority", models.IntegerField(db_default=0)),
                ("attempts", models.IntegerField(db_default=0)),
                ("max_attempts", models.IntegerField(blank=True, null=True)),
                ("worker_id", models.UUIDField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("errors", models.JSONField(db_default=models.Value([], models.JSONField()))),
                ("result", models.JSONField(blank=True, null=True)),
                ("unique_key", models.TextField(blank=True, null=True)),
                ("cancel_requested", models.BooleanField(db_default=False)),
                ("backend", models.TextField(blank=True, null=True)),
            ],
            options={
                "db_table": "axa_queue",
                "ordering": ["-created_at"],
                "permissions": [("retry_job", "Can retry job"), ("cancel_job", "Can cancel job")],
                "indexes": [
                    models.Index(condition=models.Q(("status", "queued")), fields=["run_at"], name="axa_queue_ready"),
                    models.Index(
                        models.F("name"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        condition=models.Q(("status", "queued")),
                        name="axa_queue_claim",
                    ),
                    models.Index(
                        models.F("backend"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        condition=models.Q(("backend__isnull", False), ("status", "queued")),
                        name="axa_queue_claim_task",
                    ),
                    models.Index(
                        models.F("queue"),
                        models.F("name"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        condition=models.Q(("status", "queued")),
                        name="axa_queue_claim_queue",
                    ),
                    models.Index(
                        models.F("queue"),
                        models.F("backend"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("run_at"),
                        condition=models.Q(("backend__isnull", False), ("status", "queued")),
                        name="axa_queue_claim_task_queue",
                    ),
                    models.Index(
                        condition=models.Q(("status", "running")), fields=["worker_id"], name="axa_queue_running"
                    ),
                    models.Index(fields=["status", "-created_at"], name="axa_queue_status"),
                    models.Index(fields=["-created_at"], name="axa_queue_created"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("status__in", ["queued", "running"]), ("unique_key__isnull", False)),
                        fields=("name", "unique_key"),
                        name="axa_queue_unique",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("last_run", models.DateTimeField()),
            ],
            options={
                "db_table": "axa_schedule",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="FailedJob",
            fields=[],
            options={
                "verbose_name": "failed job",
                "verbose_name_plural": "failed jobs",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.job",),
        ),
        migrations.CreateModel(
            name="QueueDashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("axa_django.job",),
        ),
        migrations.RunSQL(NOTIFY_TRIGGER, DROP_NOTIFY_TRIGGER),
        migrations.RunSQL(STORAGE, RESET_STORAGE),
    ]
