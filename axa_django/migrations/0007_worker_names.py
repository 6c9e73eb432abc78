"""Each worker records the job names and task backends it claims (for "no live worker handles this" reports)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("axa_django", "0006_queue_claim_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="backends",
            field=models.JSONField(db_default=models.Value([], models.JSONField())),
        ),
        migrations.AddField(
            model_name="worker",
            name="names",
            field=models.JSONField(db_default=models.Value([], models.JSONField())),
        ),
    ]
