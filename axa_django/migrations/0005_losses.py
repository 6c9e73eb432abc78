"""Worker losses, counted apart from attempts; fleet-wide queue limits; claim indexes no other plan can take.

The new columns have a database default or are nullable, so the seed's statements run
unchanged. ``axa_queue_limit`` holds at most one row per limited queue. The claim
indexes are rebuilt with "queued" said as a range (``status >= 'queued' AND status <=
'queued'``), the form the claims use: the seed's ``axa_queue_ready`` (``status =
'queued'``) then serves the seed's CLAIM only, and a claim keeps its plan whatever the
statistics say. Rows that become queued with a ``run_at`` already past (written so by
hand, or put back) announce it, since claims walk from floors (worker/lanes.py).
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


# A row queued with a run_at before its statement's time may lie behind the workers'
# claim floors: say so (worker/lanes.py, Lanes.heard). Rows enqueued by perform_later or the
# seed's ENQUEUE have run_at at or after that time and send nothing more.
BEHIND = """
CREATE FUNCTION axa_queue_behind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('axa_queue', 'ready:' || extract(epoch FROM NEW.run_at)::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER axa_queue_behind_insert AFTER INSERT ON axa_queue FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NEW.run_at < statement_timestamp())
    EXECUTE FUNCTION axa_queue_behind();
CREATE TRIGGER axa_queue_behind_update AFTER UPDATE OF status ON axa_queue FOR EACH ROW
    WHEN (NEW.status = 'queued' AND OLD.status <> 'queued' AND NEW.run_at < statement_timestamp())
    EXECUTE FUNCTION axa_queue_behind();
"""
NOT_BEHIND = """
DROP TRIGGER IF EXISTS axa_queue_behind_update ON axa_queue;
DROP TRIGGER IF EXISTS axa_queue_behind_insert ON axa_queue;
DROP FUNCTION IF EXISTS axa_queue_behind();
"""


class Migration(migrations.Migration):
    dependencies = [("axa_django", "0004_ops")]

    operations = [
        migrations.RunSQL(BEHIND, NOT_BEHIND),
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
