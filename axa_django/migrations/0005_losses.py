"""Worker losses: counted apart from attempts, so a dead worker does not spend a job's retries.

Both columns have a database default or are nullable, so the seed's statements run unchanged.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0004_ops")]

    operations = [
        migrations.AddField(model_name="job", name="losses", field=models.IntegerField(db_default=0)),
        migrations.AddField(model_name="job", name="max_losses", field=models.IntegerField(blank=True, null=True)),
    ]
