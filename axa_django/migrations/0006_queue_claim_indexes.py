"""Claim indexes per queue, so a --queue worker never walks other queues' ready rows.

Built CONCURRENTLY (outside a transaction): adding them to a busy queue table does
not block enqueues or claims while they build.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("axa_django", "0005_task_claim_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("name"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("status", "queued")),
                name="axa_queue_claim_queue",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("backend"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_at"),
                condition=models.Q(("backend__isnull", False), ("status", "queued")),
                name="axa_queue_claim_task_queue",
            ),
        ),
    ]
