"""The job admin: every job, the failed jobs, a read-only detail page with actions, and a dashboard."""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.cache import never_cache

from .. import unhandled
from ..models import FailedJob, Job, QueueDashboard, QueuePause
from ..ops import dashboard, fleetstats
from . import bulk, pauses, periodic, queuepage, workerpage
from .actions import breadcrumbs, cancellable, job_id
from .display import (
    JobPermissions,
    LivePage,
    error_line,
    format_duration,
    format_time,
    full_time,
    pretty_json,
    short_error,
    status_badge,
    thousands,
    yes_no,
)
from .lists import (
    FailedJobChangeList,
    JobChangeList,
    JobSearch,
    NameFilter,
    QueueFilter,
    _registered_queues,
    refuse_nul,
)
from .names import JobNamesAdmin
from .pagination import EstimatedCountPaginator
from .timeline import JobTimeline
from .workflows import JobWorkflowFields, WorkflowAdmin

__all__ = [
    "FailedJobAdmin",
    "JobAdmin",
    "JobNamesAdmin",
    "QueueDashboardAdmin",
    "WorkflowAdmin",
    "bulk",
    "error_line",
    "format_duration",
    "pauses",
    "periodic",
    "queuepage",
    "status_badge",
    "workerpage",
]

TIME_FIELDS = ("created_full", "run_at_full", "started_full", "finished_full", "updated_full", "duration_shown")


@admin.register(Job)
class JobAdmin(JobPermissions, JobWorkflowFields, JobSearch, JobTimeline):
    """All jobs: list, read-only detail, retry, cancel and delete, each behind its permission."""

    change_list_template = "admin/axa_django/job/change_list.html"
    change_form_template = "admin/axa_django/job/change_form.html"
    list_display = (
        "id_shown",
        "name",
        "status_marker",
        "queue",
        "attempts_shown",
        "run_at_shown",
        "started_shown",
        "finished_shown",
        "duration_shown",
        "error_shown",
    )
    list_display_links = ("id_shown", "name")
    list_filter = ("status", NameFilter, QueueFilter, "created_at")
    search_fields = ("name",)  # shows the search box; JobSearch.get_search_results does the searching
    ordering = ("-created_at",)
    list_per_page = 50
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = ("retry_selected", "cancel_selected", "delete_selected")
    fieldsets = (
        (None, {"fields": ("id", "name", "status_marker", "queue", "priority", "attempts_shown", "worker_shown")}),
        ("Times", {"fields": TIME_FIELDS}),
        ("Arguments", {"fields": ("args_shown",)}),
        ("Result", {"fields": ("result_shown", "unique_key", "cancel_requested_shown", "backend")}),
    )
    readonly_fields = (
        "id",
        "name",
        "status_marker",
        "queue",
        "priority",
        "attempts_shown",
        "worker_shown",
        *TIME_FIELDS,
        "args_shown",
        "result_shown",
        "unique_key",
        "cancel_requested_shown",
        "backend",
        *JobWorkflowFields.workflow_fields,
    )

    # Permissions: always Job's (JobPermissions), also when this admin serves a proxy model.

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._has(request, "delete")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """May this user queue failed jobs again (``axa_django.retry_job``)."""
        return self._has(request, "retry")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """May this user cancel jobs (``axa_django.cancel_job``)."""
        return self._has(request, "cancel")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_fieldsets(request, obj), *self.workflow_fieldset(obj)]

    # The list.

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = super().get_list_display(request)
        if len(_registered_queues()) < 2 and "queue" not in request.GET:
            columns = tuple(c for c in columns if c != "queue")  # one queue: the column says nothing
        return columns

    # Whole: ids begin with the time they were made (axa_django.ids), so their first
    # characters are shared by every job of the same minute.
    @admin.display(description="id", ordering="id")
    def id_shown(self, job: Job) -> str:
        return str(job.id)

    @admin.display(description="status", ordering="status")
    def status_marker(self, job: Job) -> SafeString:
        return status_badge(job.status)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_shown(self, job: Job) -> str:
        shown = f"{job.attempts}/{job.max_attempts}" if job.max_attempts else str(job.attempts)
        # Losses spend no attempt (a dead worker is not the job's error), so they are shown apart.
        return f"{shown} (worker lost {job.losses}x)" if job.losses else shown

    @admin.display(description="run at", ordering="run_at")
    def run_at_shown(self, job: Job) -> SafeString:
        return format_time(job.run_at)

    @admin.display(description="started", ordering="started_at")
    def started_shown(self, job: Job) -> SafeString:
        return format_time(job.started_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished_shown(self, job: Job) -> SafeString:
        return format_time(job.finished_at)

    @admin.display(description="duration")
    def duration_shown(self, job: Job) -> str:
        return format_duration(job.duration)

    @admin.display(description="error")
    def error_shown(self, job: Job) -> SafeString:
        line = error_line(job)
        if not line:
            return mark_safe("")
        return format_html('<span class="axa-error" title="{}">{}</span>', line, short_error(line))

    # The detail page.

    @admin.display(description="worker")
    def worker_shown(self, job: Job) -> str:
        return str(job.worker_id) if job.worker_id else "-"

    @admin.display(description="created")
    def created_full(self, job: Job) -> str:
        return full_time(job.created_at)

    @admin.display(description="run at")
    def run_at_full(self, job: Job) -> str:
        return full_time(job.run_at)

    @admin.display(description="started")
    def started_full(self, job: Job) -> str:
        return full_time(job.started_at)

    @admin.display(description="finished")
    def finished_full(self, job: Job) -> str:
        return full_time(job.finished_at)

    @admin.display(description="updated")
    def updated_full(self, job: Job) -> str:
        return full_time(job.updated_at)

    @admin.display(description="arguments")
    def args_shown(self, job: Job) -> SafeString:
        return pretty_json(job.args)

    @admin.display(description="result")
    def result_shown(self, job: Job) -> SafeString:
        return pretty_json(job.result) if job.result is not None else mark_safe("-")

    @admin.display(description="cancel requested")
    def cancel_requested_shown(self, job: Job) -> str:
        return yes_no(job.cancel_requested)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        job = Job.objects.filter(pk=job_id(object_id)).first()
        context = dict(extra_context or {})
        if job is not None:
            attempts = [entry for entry in (job.errors or []) if isinstance(entry, dict)]
            name = self.admin_site.name
            context.update(
                job=job,
                attempts=list(reversed(attempts)),
                # A producer that keeps no history (the seed's FINISH) leaves only the error column.
                bare_error=job.error if job.error and not attempts else None,
                # Why it failed is what a failed job's page is opened for.
                failure_first=job.status == Job.Status.FAILED,
                can_retry=self.has_retry_permission(request) and job.status == Job.Status.FAILED,
                can_cancel=self.has_cancel_permission(request) and cancellable(job),
                can_delete=self.has_delete_permission(request, job),
                retry_url=reverse("admin:axa_django_job_retry", args=[job.pk], current_app=name),
                cancel_url=reverse("admin:axa_django_job_cancel", args=[job.pk], current_app=name),
                delete_url=reverse("admin:axa_django_job_delete", args=[job.pk], current_app=name),
                **self.timeline_context(request, job),
            )
        return super().change_view(request, object_id, form_url, context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # PostgreSQL text cannot hold NUL: refuse it here rather than fail in psycopg with a 500.
        refused = refuse_nul(request.GET, request.POST)
        if refused is not None:
            return refused
        name = self.admin_site.name
        context = {
            "can_retry": self.has_retry_permission(request),
            "retry_matching_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_retry_matching", current_app=name
            ),
            "dashboard_url": reverse("admin:axa_django_queuedashboard_changelist", current_app=name),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def get_urls(self) -> list[URLPattern]:
        return self.action_urls() + self.timeline_urls() + super().get_urls()


@admin.register(FailedJob)
class FailedJobAdmin(JobAdmin):
    """Only failed jobs, the most recent failure first, with each error's first line."""

    list_display = ("id_shown", "name", "failed_at", "attempts_shown", "queue", "error_shown")
    list_filter = (NameFilter, QueueFilter, "finished_at")
    ordering = ("-finished_at",)
    search_time_field = "finished_at"  # after: and before: bound the time this list is sorted by
    search_time_label = "failed at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=Job.Status.FAILED)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return FailedJobChangeList

    @admin.display(description="failed at", ordering="finished_at")
    def failed_at(self, job: Job) -> SafeString:
        return format_time(job.finished_at)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # One detail page for every job: it outlives the job's failure.
        return HttpResponseRedirect(reverse("admin:axa_django_job_change", args=[object_id]))


@admin.register(QueueDashboard)
class QueueDashboardAdmin(LivePage, admin.ModelAdmin):  # type: ignore[type-arg]
    """The dashboard: counts by status, the oldest ready job, throughput per hour, live workers, unhandled names."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("axa_django.view_job") or request.user.has_perm("axa_django.change_job")

    @method_decorator(never_cache)
    def data_view(self, request: HttpRequest) -> HttpResponse:
        """The live dashboard's poll: the figures as JSON."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            return JsonResponse({"error": "you may not view jobs"}, status=403)
        return dashboard.live_response()

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        stats = dashboard.collect()
        live = fleetstats.collect()
        current = {w.id: w.jobs for w in live.workers}
        jobs_url = reverse("admin:axa_django_job_changelist", current_app=self.admin_site.name)
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(self.admin_site, self.opts, ("", "Dashboard")),
            "title": "Queue dashboard",
            "opts": self.opts,
            "stats": stats,
            "statuses": [
                (
                    status,
                    status_badge(status),
                    ("about " if stats.counts_estimated else "") + thousands(count),
                    f"{jobs_url}?status__exact={status}",
                )
                for status, count in stats.counts.items()
            ],
            "ready": thousands(stats.ready),
            "oldest_ready": format_duration(stats.oldest_ready_age) if stats.oldest_ready_age is not None else None,
            "chart": dashboard.chart_svg(stats.hours),
            "completed_24h": thousands(sum(h.completed for h in stats.hours)),
            "failed_24h": thousands(sum(h.failed for h in stats.hours)),
            "workers": [
                (w, format_duration(w.heartbeat_age), thousands(w.running), current.get(str(w.id), []))
                for w in stats.workers
            ],
            "queues": [
                (
                    q,
                    format_duration(datetime.timedelta(seconds=q.oldest_ready_seconds))
                    if q.oldest_ready_seconds is not None
                    else "none",
                )
                for q in live.queues
            ],
            "data_url": reverse("admin:axa_django_queuedashboard_data", current_app=self.admin_site.name),
            "refresh_seconds": dashboard.refresh_seconds(request.GET.get("refresh")),
            "unhandled": [
                (
                    row,
                    ("at least " if row.ready >= unhandled.CAP else "") + thousands(row.ready),
                    f"{jobs_url}?{urlencode({'status__exact': 'queued', 'name': row.name})}" if row.name else "",
                )
                for row in unhandled.find()
            ],
            "jobs_url": jobs_url,
            "paused": list(QueuePause.objects.all()),
            "paused_url": reverse("admin:axa_django_queuepause_changelist", current_app=self.admin_site.name),
            "failed_url": reverse("admin:axa_django_failedjob_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/dashboard.html", context)
