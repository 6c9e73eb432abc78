"""Tables of the test app's jobs."""

from django.db import models


class Effect(models.Model):
    """A write of an exactly-once job (tests/test_exactly_once.py): one row per run that committed.

    Not unique on ``job_id``, so that a job whose write committed twice shows two rows.
    """

    job_id = models.UUIDField(db_index=True)
    token = models.CharField(max_length=100, blank=True, default="")
