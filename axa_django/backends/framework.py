"""The tasks framework QueueBackend serves: Django's ``django.tasks`` (Django >= 6.0), or on
Django 5.2 the ``django-tasks`` backport (``django_tasks``), whose API is the same under other
names. Everything of the framework the package uses is imported from here, once.

On Django >= 6.0 a library's backport task runs on QueueBackend too: the backport's
``@task`` builds its Task with the backend's ``task_class``, which is Django's.
"""

from __future__ import annotations

import django

if django.VERSION >= (6, 0):
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django.tasks"
else:
    from ..checks import tasks_framework_problem

    # Said before the import: an older backport imports, under other names (0.9-0.11).
    if (problem := tasks_framework_problem()) is not None:
        raise ImportError(problem)
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django_tasks"

__all__ = [
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
