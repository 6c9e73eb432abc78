"""Tables of the test app's jobs."""

from django.db import models

# A library's tasks imported while models load, as a site's apps import their libraries
# (Wagtail's search imports modelsearch.tasks): the worker runs them because they are
# imported at start, though tests.tasklib is no installed app (tests/test_tasks_library.py).
import tests.tasklib.tasks  # noqa: F401


class Effect(models.Model):
    """A write of an exactly-once job (tests/test_exactly_once.py): one row per run that committed.

    Not unique on ``job_id``, so that a job whose write committed twice shows two rows.
    """

    job_id = models.UUIDField(db_index=True)
    token = models.CharField(max_length=100, blank=True, default="")
