"""Indexes for the admin's lists that no claim can take and no history slows down.

``axa_queue_status`` leaves queued rows out: any index led by ``status`` serves the
claims' "status BETWEEN 'queued' AND 'queued'" too, and on some small-table statistics a
claim's cached plan walked every queued row through it and sorted them. ``axa_queue_failed``
serves the failed list in its own order (the latest failure first, then id), which
sorted every failed row for each page of a big history.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("axa_django", "0006_flow_keys"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="axa_queue_status",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "queued"), _negated=True),
                fields=["status", "-created_at"],
                name="axa_queue_status",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.OrderBy(models.F("finished_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                condition=models.Q(("status", "failed")),
                name="axa_queue_failed",
            ),
        ),
    ]
