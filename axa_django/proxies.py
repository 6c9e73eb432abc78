"""Proxy models that give the admin its own index entries: Failed jobs and the Dashboard."""

from __future__ import annotations

from .models import Job


class FailedJob(Job):
    """Jobs whose last attempt failed and that have no attempts left."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "failed job"
        verbose_name_plural = "failed jobs"
        # Access is governed by Job's permissions (view_job, retry_job, ...), not new ones.
        default_permissions = ()


class QueueDashboard(Job):
    """The queue dashboard's admin entry; it lists no rows of its own."""

    class Meta:
        proxy = True
        app_label = "axa_django"
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()
