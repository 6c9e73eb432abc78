"""Worker losses, counted apart from attempts; fleet-wide queue limits; claim indexes no other plan can take.

The new columns have a database default or are nullable, so the seed's statements run
unchanged. ``axa_queue_limit`` holds at most one row per limited queue. The claim
indexes are rebuilt with "queued" said as a range (``status >= 'queued' AND status <=
'queued'``), the form the claims use: the seed's ``axa_queue_ready`` (``status =
'queued'``) then serves the seed's CLAIM only, and a claim keeps its plan whatever the
statistics say.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


def _claim_index(name: str, *columns: str, tasks: bool = False) -> models.Index:
    condition = models.Q(("status__gte", "queued"), ("status__lte", "queued"))
    if tasks:
        condition &= models.Q(("backend__isnull", False))
    fields = [
        models.F(c) if c != "priority" else models.OrderBy(models.F("priority"), descending=True) for c in columns
    ]
    return models.Index(*fields, condition=condition, name=name)


CLAIM_INDEXES = [
    _claim_index("axa_queue_claim", "name", "priority", "run_at"),
    _claim_index("axa_queue_claim_task", "backend", "priority", "run_at", tasks=True),
    _claim_index("axa_queue_claim_queue", "queue", "name", "priority", "run_at"),
    _claim_index("axa_queue_claim_task_queue", "queue", "backend", "priority", "run_at", tasks=True),
]


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0004_ops")]

    operations = [
        *(migrations.RemoveIndex(model_name="job", name=index.name) for index in CLAIM_INDEXES),
        *(migrations.AddIndex(model_name="job", index=index) for index in CLAIM_INDEXES),
        migrations.AddField(model_name="job", name="losses", field=models.IntegerField(db_default=0)),
        migrations.AddField(model_name="job", name="max_losses", field=models.IntegerField(blank=True, null=True)),
        migrations.CreateModel(
            name="QueueLimit",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("max_running", models.IntegerField()),
                ("set_by", models.TextField(blank=True, db_default="")),
                ("set_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "verbose_name": "queue limit",
                "verbose_name_plural": "queue limits",
                "db_table": "axa_queue_limit",
                "ordering": ["queue"],
                "default_permissions": ("view",),
                "constraints": [
                    models.CheckConstraint(condition=models.Q(("max_running__gt", 0)), name="axa_queue_limit_positive")
                ],
            },
        ),
    ]
