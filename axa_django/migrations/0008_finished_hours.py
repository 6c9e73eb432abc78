"""The dashboard chart's past hours, counted once each (a day of history is not read at each page load)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("axa_django", "0007_admin_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="FinishedHour",
            fields=[
                ("hour", models.DateTimeField(primary_key=True, serialize=False)),
                ("completed", models.BigIntegerField()),
                ("failed", models.BigIntegerField()),
            ],
            options={
                "db_table": "axa_finished_hour",
                "ordering": ["hour"],
                "default_permissions": (),
            },
        ),
    ]
