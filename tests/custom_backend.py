"""A project's own subclass of QueueBackend, named in TASKS by its path (tests/test_tasks_backend.py)."""

from axa_django.backends import QueueBackend


class CustomQueueBackend(QueueBackend):
    pass
