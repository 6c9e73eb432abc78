"""Flow control: per-row timeout and limit keys on axa_queue, their claim indexes, rate buckets, paused queues."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0001_initial")]

    operations = [
        migrations.AddField(model_name="job", name="timeout", field=models.FloatField(blank=True, null=True)),
        migrations.AddField(model_name="job", name="concurrency_key", field=models.TextField(blank=True, null=True)),
        migrations.AddField(model_name="job", name="rate_key", field=models.TextField(blank=True, null=True)),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("name"),
                models.F("concurrency_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("concurrency_key__isnull", False), ("status", "queued")),
                name="axa_queue_claim_limited",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("concurrency_key__isnull", False), ("status", "running")),
                fields=["name", "concurrency_key"],
                name="axa_queue_limited_running",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("name"),
                models.F("rate_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("rate_key__isnull", False), ("status", "queued")),
                name="axa_queue_claim_rated",
            ),
        ),
        migrations.CreateModel(
            name="RateBucket",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "name", "key", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("name", models.TextField()),
                ("key", models.TextField()),
                ("tat", models.DateTimeField()),
            ],
            options={"db_table": "axa_rate_bucket", "default_permissions": ()},
        ),
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("reason", models.TextField(blank=True, db_default="")),
                ("paused_by", models.TextField(blank=True, db_default="")),
                ("paused_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "paused queue",
                "verbose_name_plural": "paused queues",
                "db_table": "axa_paused_queue",
                "ordering": ["queue"],
                "default_permissions": ("view",),
                "permissions": [("pause_queue", "Can pause and resume queues")],
            },
        ),
    ]
