"""Worker losses, counted apart from attempts, and fleet-wide queue limits (reliability, round 3).

The new columns have a database default or are nullable, so the seed's statements run
unchanged. ``axa_queue_limit`` holds at most one row per limited queue.
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0004_ops")]

    operations = [
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
