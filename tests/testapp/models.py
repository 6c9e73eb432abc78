"""Tables of the test app's jobs."""

from django.contrib.contenttypes.fields import GenericForeignKey
from django.db import models


class Effect(models.Model):
    """A write of an exactly-once job (tests/test_exactly_once.py): one row per run that committed.

    Not unique on ``job_id``, so that a job whose write committed twice shows two rows.
    """

    job_id = models.UUIDField(db_index=True)
    token = models.CharField(max_length=100, blank=True, default="")


class Report(models.Model):
    """A user's model that remembers the job building it (tests/test_references.py): the documented pattern."""

    title = models.CharField(max_length=100, default="")
    job = models.ForeignKey(
        "axa_django.Job", null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False, related_name="reports"
    )


class Note(models.Model):
    """A generic reference to any row, a job among them (tests/test_references.py)."""

    content_type = models.ForeignKey("contenttypes.ContentType", on_delete=models.CASCADE)
    object_id = models.CharField(max_length=64)
    target = GenericForeignKey("content_type", "object_id")
    text = models.CharField(max_length=100, default="")
