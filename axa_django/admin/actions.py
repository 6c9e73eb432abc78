"""The job admin's state changes: retry and cancel buttons, "retry all matching" behind a confirmation, list actions."""

from __future__ import annotations

import uuid
from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from ..models import Job, RetryResult
from .lists import refuse_nul

# Django 6 styles only <ol class="breadcrumbs">; 5.2 only <div class="breadcrumbs">.
BREADCRUMBS_OL = django.VERSION >= (6, 0)


def breadcrumbs(admin_site: admin.AdminSite, opts: Any, *links: tuple[str, str]) -> dict[str, Any]:
    """Context for ``_breadcrumbs.html``: Home, the app, then ``links`` as (url, label), the last one current."""
    app = reverse("admin:app_list", kwargs={"app_label": opts.app_label}, current_app=admin_site.name)
    crumbs = [(reverse("admin:index", current_app=admin_site.name), "Home"), (app, opts.app_config.verbose_name)]
    crumbs += links
    return {"axa_crumbs": crumbs[:-1], "axa_current": crumbs[-1][1], "axa_breadcrumbs_ol": BREADCRUMBS_OL}


class JobActions(admin.ModelAdmin):
    """The job admins' state changes: each behind its permission, each a guarded UPDATE."""

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """May this user queue failed jobs again (``axa_django.retry_job``)."""
        raise NotImplementedError

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """May this user cancel jobs (``axa_django.cancel_job``)."""
        raise NotImplementedError

    def action_urls(self) -> list[URLPattern]:
        """The retry, cancel and retry-matching URLs, to put before the admin's own."""
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        urls = [path("retry-matching/", wrap(self.retry_matching_view), name=f"{info}_retry_matching")]
        if self.model is Job:
            urls += [
                path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{info}_retry"),
                path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{info}_cancel"),
            ]
        return urls

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Queue one failed job again to run now."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self._post_target(request, object_id, self.has_retry_permission(request))
        result = Job.objects.filter(pk=job.pk).retry()
        if result:
            self.log_change(request, job, "Retried: queued to run again.")
            self.message_user(request, f"Job {job.pk} is queued to run again.", messages.SUCCESS)
        elif job.pk in result.skipped:
            text = f"Job {job.pk} was not retried: its unique key {job.unique_key!r} is {_in_use(result, job.pk)}."
            self.message_user(request, text, messages.WARNING)
        else:
            job.refresh_from_db()
            text = f"Job {job.pk} was not retried: it is {job.status}, not failed."
            self.message_user(request, text, messages.WARNING)
        return _to_job(job)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel one queued job, or ask the worker running it to stop."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        job = self._post_target(request, object_id, self.has_cancel_permission(request))
        was = job.status
        if Job.objects.filter(pk=job.pk).cancel():
            if was == Job.Status.RUNNING:
                text = f"Job {job.pk} is running; its worker was asked to cancel it."
            else:
                text = f"Job {job.pk} was cancelled."
            self.log_change(request, job, text)
            self.message_user(request, text, messages.SUCCESS)
        else:
            job.refresh_from_db()
            text = f"Job {job.pk} was not cancelled: it is {job.status}."
            self.message_user(request, text, messages.WARNING)
        return _to_job(job)

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        """The former "retry all matching" (one UPDATE): now the bulk retry's confirmation, in batches (bulk.py)."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        refused = refuse_nul(request.GET, request.POST)
        if refused is not None:
            return refused
        site = self.admin_site.name
        start = reverse("admin:axa_django_bulkoperation_start", args=[self.opts.model_name, "retry"], current_app=site)
        query = request.GET.urlencode()
        return HttpResponseRedirect(f"{start}?{query}" if query else start)

    def _post_target(self, request: HttpRequest, object_id: str, allowed: bool) -> Job:
        if not (allowed and self.has_view_permission(request)):
            raise PermissionDenied
        job = Job.objects.filter(pk=job_id(object_id)).first()
        if job is None:
            raise Http404("No such job.")
        return job

    @admin.action(description="Retry selected failed jobs", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        result = queryset.retry()
        self._report(request, result, "queued to run again", "not failed", len(result.skipped), _key_skips(result))

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        changed = queryset.cancel()
        self._report(request, changed, "cancelled (running ones asked to stop)", "already finished or cancelling")

    def _report(
        self,
        request: HttpRequest,
        changed: int,
        done: str,
        skipped_because: str,
        explained: int = 0,
        explanation: str = "",
    ) -> None:
        """Say how many changed, how many were skipped for ``skipped_because``, then the ``explained`` others."""
        text = f"{changed} job{'s' if changed != 1 else ''} {done}."
        if request.POST.get("select_across") != "1":
            skipped = len(request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)) - changed - explained
            if skipped > 0:
                text += f" Skipped {skipped} {'jobs' if skipped != 1 else 'job'} {skipped_because}."
        text += explanation
        level = messages.SUCCESS if changed and not explained else messages.WARNING
        self.message_user(request, text, level)


def _to_job(job: Job) -> HttpResponse:
    return HttpResponseRedirect(reverse("admin:axa_django_job_change", args=[job.pk]))


def _in_use(result: RetryResult, job_id: uuid.UUID) -> str:
    holder = result.skipped[job_id]
    return f"in use by job {holder}" if holder is not None else "in use by another job"


def _key_skips(result: RetryResult, shown: int = 5) -> str:
    """The jobs a retry left failed because their unique key is in use, each with the job holding it."""
    if not result.skipped:
        return ""
    count = len(result.skipped)
    named = [f"job {job_id} (key {_in_use(result, job_id)})" for job_id in list(result.skipped)[:shown]]
    more = f" and {count - shown} more" if count > shown else ""
    return f" Skipped {count} job{'s' if count != 1 else ''} whose unique key is in use: {'; '.join(named)}{more}."


def cancellable(job: Job) -> bool:
    """Whether cancel would change ``job``: queued or waiting, or running and not yet asked to stop."""
    return job.status in (Job.Status.QUEUED, Job.Status.WAITING) or (
        job.status == Job.Status.RUNNING and not job.cancel_requested
    )


def job_id(object_id: str) -> uuid.UUID | None:
    """The job id in a URL's ``object_id``, or None if it is not one."""
    try:
        return uuid.UUID(unquote(object_id))
    except ValueError:
        return None
