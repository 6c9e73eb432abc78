"""The tasks framework's names as a library imports them: Django's django.tasks on
Django >= 6.0, the django-tasks backport (django_tasks) on Django 5.2."""

import django

if django.VERSION >= (6, 0):
    from django.tasks import TaskContext, TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
else:
    from django_tasks import TaskContext, TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

__all__ = [
    "InvalidTask",
    "InvalidTaskBackend",
    "TaskContext",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
