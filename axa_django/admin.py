"""The job admin: every job, the failed jobs, a read-only detail page with actions, and a dashboard."""

from __future__ import annotations

import datetime
import json
import re
import uuid
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left, Right
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from . import dashboard, registry
from .models import Job, RetryResult
from .pagination import EstimatedCountPaginator
from .proxies import FailedJob, QueueDashboard

STATUS_ICONS = {
    Job.Status.QUEUED: "\u25f7",  # clock
    Job.Status.RUNNING: "\u25b6",  # play
    Job.Status.COMPLETED: "\u2714",  # check
    Job.Status.FAILED: "\u2716",  # cross
    Job.Status.CANCELLED: "\u2298",  # slashed circle
}
HEX_PREFIX = re.compile(r"^[0-9a-f]{4,32}$")


def status_badge(status: str) -> SafeString:
    """A coloured status marker with an icon, so status reads without colour too."""
    label = Job.Status(status).label if status in Job.Status.values else status
    return format_html(
        '<span class="axa-badge axa-{}" title="{}">{} {}</span>',
        status if status in Job.Status.values else "other",
        status,
        STATUS_ICONS.get(status, "?"),
        label,
    )


def format_duration(value: datetime.timedelta | None) -> str:
    """A short human duration: 12 ms, 3.4 s, 2 min 5 s, 1 h 4 min."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def local_time(value: datetime.datetime) -> datetime.datetime:
    """``value`` in the current time zone, aware; a naive value (USE_TZ = False) is taken as TIME_ZONE's."""
    if timezone.is_aware(value):
        return timezone.localtime(value)
    # With USE_TZ = False, Django reads timestamptz columns as naive datetimes in TIME_ZONE.
    return value.replace(tzinfo=timezone.get_default_timezone())


def format_time(value: datetime.datetime | None) -> SafeString:
    """A compact timestamp in the current time zone (time only if today), the full one on hover."""
    if value is None:
        return mark_safe("-")
    local = local_time(value)
    today = local_time(timezone.now()).date()
    if local.date() == today:
        short = local.strftime("%H:%M:%S")
    elif local.year == today.year:
        short = local.strftime("%b %d %H:%M")
    else:
        short = local.strftime("%Y-%m-%d")
    return format_html('<time datetime="{}" title="{}">{}</time>', local.isoformat(), local.isoformat(" "), short)


def full_time(value: datetime.datetime | None) -> str:
    """A timestamp to the millisecond with its zone, for the detail page."""
    if value is None:
        return "-"
    local = local_time(value)
    return f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} {local.tzname()}"


def error_line(job: Job) -> str:
    """The first line of a job's latest error, preferring the attempt history's "type: message"."""
    message = getattr(job, "last_error_message", None)
    if message is not None:
        kind = (getattr(job, "last_error_type", None) or "").rpartition(".")[2]
        first = message.strip().splitlines()[0] if message.strip() else ""
        return f"{kind}: {first}" if kind else first
    head = getattr(job, "error_head", None)
    if head is None:
        return ""
    head = head.strip()
    if head.startswith("Traceback"):
        # A bare traceback: its last line names the exception.
        tail = (getattr(job, "error_tail", None) or "").strip().splitlines()
        return tail[-1] if tail else head.splitlines()[0]
    return head.splitlines()[0] if head else ""


def pretty_json(value: Any) -> SafeString:
    """Indented JSON in a <pre>, escaped."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="axa-json">{}</pre>', text)


class NameFilter(admin.SimpleListFilter):
    """Filter by job name; the choices come from the registry, so no DISTINCT over the table."""

    title = "name"
    parameter_name = "name"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        names = set(registry.registry)
        current = self.value()
        if current:
            names.add(current)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(name=self.value()) if self.value() else queryset


def _registered_queues() -> set[str]:
    return {job.options.queue for job in registry.registry.values()}


class QueueFilter(admin.SimpleListFilter):
    """Filter by queue; shown once registered jobs use more than one queue."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        queues = _registered_queues()
        current = self.value()
        if current:
            queues.add(current)
        if len(queues) < 2:
            return []
        return [(queue, queue) for queue in sorted(queues)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class JobChangeList(ChangeList):
    """Leaves the large columns out of list pages and fetches only each error's summary."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.defer("args", "result", "errors", "error").annotate(
            last_error_type=KT("errors__-1__type"),
            last_error_message=Left(KT("errors__-1__message"), 500),
            error_head=Left("error", 500),
            error_tail=Right("error", 500),
        )


TIME_FIELDS = ("created_full", "run_at_full", "started_full", "finished_full", "updated_full", "duration_shown")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """All jobs: list, read-only detail, retry, cancel and delete, each behind its permission."""

    change_list_template = "admin/axa_django/job/change_list.html"
    change_form_template = "admin/axa_django/job/change_form.html"
    list_display = (
        "short_id",
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
    list_display_links = ("short_id", "name")
    list_filter = ("status", NameFilter, QueueFilter, "created_at")
    search_fields = ("name",)  # shows the search box; get_search_results does the searching
    search_help_text = "A job id (or its first characters), a name, or text in the arguments or error."
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
        ("Result", {"fields": ("result_shown", "unique_key", "cancel_requested", "backend")}),
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
        "cancel_requested",
        "backend",
    )

    # Permissions: always Job's, also when this admin serves a proxy model.

    def _has(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{Job._meta.app_label}.{action}_{Job._meta.model_name}")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._has(request, "view") or self._has(request, "change")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the detail page is read-only; state changes go through retry and cancel

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._has(request, "delete")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        """May this user queue failed jobs again (``axa_django.retry_job``)."""
        return self._has(request, "retry")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """May this user cancel jobs (``axa_django.cancel_job``)."""
        return self._has(request, "cancel")

    # The list.

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = super().get_list_display(request)
        if len(_registered_queues()) < 2 and "queue" not in request.GET:
            columns = tuple(c for c in columns if c != "queue")  # one queue: the column says nothing
        return columns

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            # A whole id is looked up through the primary key alone.
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        text = Q(name__icontains=term) | Q(args__icontains=term) | Q(error__icontains=term)
        prefix = term.lower().replace("-", "")
        if HEX_PREFIX.match(prefix):
            # The first characters of an id, as the list shows them: a range on the primary key.
            low = uuid.UUID(prefix.ljust(32, "0"))
            high = uuid.UUID(prefix.ljust(32, "f"))
            text |= Q(pk__gte=low, pk__lte=high)
        return queryset.filter(text), False

    @admin.display(description="id", ordering="id")
    def short_id(self, job: Job) -> str:
        return str(job.id)[:8]

    @admin.display(description="status", ordering="status")
    def status_marker(self, job: Job) -> SafeString:
        return status_badge(job.status)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_shown(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}" if job.max_attempts else str(job.attempts)

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
        short = line if len(line) <= 120 else line[:119] + "\u2026"
        return format_html('<span class="axa-error" title="{}">{}</span>', line, short)

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

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        job = Job.objects.filter(pk=_job_id(object_id)).first()
        context = dict(extra_context or {})
        if job is not None:
            attempts = [entry for entry in (job.errors or []) if isinstance(entry, dict)]
            context.update(
                job=job,
                attempts=list(reversed(attempts)),
                # A producer that keeps no history (the seed's FINISH) leaves only the error column.
                bare_error=job.error if job.error and not attempts else None,
                can_retry=self.has_retry_permission(request) and job.status == Job.Status.FAILED,
                can_cancel=self.has_cancel_permission(request) and _cancellable(job),
                can_delete=self.has_delete_permission(request, job),
                retry_url=reverse("admin:axa_django_job_retry", args=[job.pk], current_app=self.admin_site.name),
                cancel_url=reverse("admin:axa_django_job_cancel", args=[job.pk], current_app=self.admin_site.name),
                delete_url=reverse("admin:axa_django_job_delete", args=[job.pk], current_app=self.admin_site.name),
            )
        return super().change_view(request, object_id, form_url, context)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context = {
            "can_retry": self.has_retry_permission(request),
            "retry_matching_url": reverse(
                f"admin:{self.opts.app_label}_{self.opts.model_name}_retry_matching", current_app=self.admin_site.name
            ),
            "dashboard_url": reverse("admin:axa_django_queuedashboard_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    # Retry and cancel: POST only, each behind its permission, each a guarded UPDATE.

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        urls = [path("retry-matching/", wrap(self.retry_matching_view), name=f"{info}_retry_matching")]
        if self.model is Job:
            urls += [
                path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{info}_retry"),
                path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{info}_cancel"),
            ]
        return urls + super().get_urls()

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
        return self._to_job(job)

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
            self.message_user(request, f"Job {job.pk} was not cancelled: it is {job.status}.", messages.WARNING)
        return self._to_job(job)

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        """Queue again every failed job the list's current filters and search match, in one UPDATE."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and self.has_retry_permission(request)):
            raise PermissionDenied
        back = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        query = request.GET.urlencode()
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            self.message_user(request, "Those filters are not valid; nothing was retried.", messages.ERROR)
            return HttpResponseRedirect(back)
        result = changelist.queryset.retry()
        text = f"Queued {result} failed job{'s' if result != 1 else ''} matching this filter to run again."
        self.message_user(
            request,
            text + _key_skips(result),
            messages.SUCCESS if result and not result.skipped else messages.WARNING,
        )
        return HttpResponseRedirect(f"{back}?{query}" if query else back)

    def _post_target(self, request: HttpRequest, object_id: str, allowed: bool) -> Job:
        if not (allowed and self.has_view_permission(request)):
            raise PermissionDenied
        job = Job.objects.filter(pk=_job_id(object_id)).first()
        if job is None:
            raise Http404("No such job.")
        return job

    def _to_job(self, job: Job) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:axa_django_job_change", args=[job.pk]))

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
        self.message_user(request, text, messages.SUCCESS if changed and not explained else messages.WARNING)


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


def _cancellable(job: Job) -> bool:
    return job.status == Job.Status.QUEUED or (job.status == Job.Status.RUNNING and not job.cancel_requested)


def _job_id(object_id: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(unquote(object_id))
    except ValueError:
        return None


@admin.register(FailedJob)
class FailedJobAdmin(JobAdmin):
    """Only failed jobs, the most recent failure first, with each error's first line."""

    list_display = ("short_id", "name", "failed_at", "attempts_shown", "queue", "error_shown")
    list_filter = (NameFilter, QueueFilter, "finished_at")
    ordering = ("-finished_at",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).filter(status=Job.Status.FAILED)

    @admin.display(description="failed at", ordering="finished_at")
    def failed_at(self, job: Job) -> SafeString:
        return format_time(job.finished_at)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # One detail page for every job: it outlives the job's failure.
        return HttpResponseRedirect(reverse("admin:axa_django_job_change", args=[object_id]))


@admin.register(QueueDashboard)
class QueueDashboardAdmin(admin.ModelAdmin):
    """The dashboard: counts by status, the oldest ready job, throughput per hour and live workers."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("axa_django.view_job") or request.user.has_perm("axa_django.change_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=f"{info}_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        stats = dashboard.collect()
        jobs_url = reverse("admin:axa_django_job_changelist", current_app=self.admin_site.name)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "opts": self.opts,
            "stats": stats,
            "statuses": [
                (status, status_badge(status), count, f"{jobs_url}?status__exact={status}")
                for status, count in stats.counts.items()
            ],
            "oldest_ready": format_duration(stats.oldest_ready_age) if stats.oldest_ready_age is not None else None,
            "chart": dashboard.chart_svg(stats.hours),
            "completed_24h": sum(h.completed for h in stats.hours),
            "failed_24h": sum(h.failed for h in stats.hours),
            "workers": [(w, format_duration(w.heartbeat_age)) for w in stats.workers],
            "jobs_url": jobs_url,
            "failed_url": reverse("admin:axa_django_failedjob_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/dashboard.html", context)
