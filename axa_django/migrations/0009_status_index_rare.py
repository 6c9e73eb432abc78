"""``axa_queue_status`` keeps the rarer statuses only: no claim or finish writes it.

Every claim (to running) and every finish (to completed) wrote an entry, two of the
fourteen index entries a job cost; the admin's lists of running and completed jobs walk
``axa_queue_running`` and ``axa_queue_created`` instead.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("axa_django", "0008_finished_hours"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="axa_queue_status",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running", "completed"]), _negated=True),
                fields=["status", "-created_at"],
                name="axa_queue_status",
            ),
        ),
    ]
