"""A user's models pointing at jobs (tests/test_references.py): an app of its own, since it needs contenttypes."""

from django.contrib.contenttypes.fields import GenericForeignKey
from django.db import models


class Report(models.Model):
    """A report that remembers the job building it: the documented pattern (docs/jobs.md, 'Pointing at a job')."""

    title = models.CharField(max_length=100, default="")
    job = models.ForeignKey(
        "axa_django.Job", null=True, blank=True, on_delete=models.SET_NULL, db_constraint=False, related_name="reports"
    )


class Note(models.Model):
    """A generic reference to any row, a job among them."""

    content_type = models.ForeignKey("contenttypes.ContentType", on_delete=models.CASCADE)
    object_id = models.CharField(max_length=64)
    target = GenericForeignKey("content_type", "object_id")
    text = models.CharField(max_length=100, default="")
