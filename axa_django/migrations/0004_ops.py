"""Operations: the trace context a job was enqueued under, and the indexes the health figures read.

``trace_context`` is nullable (written only when OpenTelemetry is installed and a
tracer provider is set), so the seed's statements run unchanged and no job's args
change. The partial indexes let jobhealth, the metrics view and the live dashboard find
ready rows per queue and recently finished rows by index descent, whatever the table holds.
"""

from django.db import migrations, models

import axa_django.models


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0003_workflow")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=axa_django.models.RowJSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("attempts__gte", 0), ("status", "queued")),
                fields=["queue", "run_at"],
                name="axa_queue_ready_queue",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)), fields=["finished_at"], name="axa_queue_finished"
            ),
        ),
    ]
