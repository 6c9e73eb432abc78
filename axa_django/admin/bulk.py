"""Bulk operations in the admin: retry, cancel or delete every job a list's filter matches, in the background.

The job lists link "Retry / Cancel / Delete all matching" to a confirmation page with the
count (the planner's estimate when large); confirming saves a ``BulkOperation`` and
enqueues its job (bulkjob.py), and opens its progress page, which refreshes itself. The
operations are listed newest first. Starting, cancelling and resuming one need the
permission of its kind (``retry_job``, ``cancel_job``, ``delete_job``) besides ``view_job``.
"""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.db import OperationalError, connections, transaction
from django.db.models.functions import Now
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.cache import never_cache

from .. import conf
from ..models import Job
from ..models.queue import BulkOperation
from ..ops import dashboard
from ..sql import LIVE as LIVE_LEASE
from . import bulkjob
from .actions import breadcrumbs
from .display import JobPermissions, format_time, full_time, thousands
from .lists import QUERY_CANCELED, SEARCH_SECONDS, Deadline, refuse_nul
from .pagination import EstimatedCountPaginator

logger = logging.getLogger("axa_django")

Status = BulkOperation.Status
# The progress page's poll, unless ?refresh=N says otherwise: a running operation moves by the second.
REFRESH_SECONDS = 2
LIVE = (Status.QUEUED, Status.RUNNING)
# The job statuses whose badge colours an operation's status.
BADGES = {Status.QUEUED: "queued", Status.RUNNING: "running", Status.DONE: "completed"}
VERBS = {"retry": "Retry", "cancel": "Cancel", "delete": "Delete"}
# The lists an operation starts from, as the admin's index names them.
LABELS = {"job": "Jobs", "failedjob": "Failed jobs"}
# What the confirmation asks: the jobs (a noun, made plural by the count), and what becomes of them.
WHAT = {
    "retry": ("failed job", "to queue again to run now"),
    "cancel": ("queued, waiting or running job", "to cancel (running ones are asked to stop)"),
    "delete": ("job", "to delete"),
}
# Live workers that would claim the operation's job now: a current lease, its name, its queue.
SERVED = f"""
SELECT count(*) FILTER (WHERE {LIVE_LEASE} AND names ? %(name)s AND (queues = '[]'::jsonb OR queues ? %(queue)s)),
       EXISTS (SELECT 1 FROM axa_paused_queue WHERE queue = %(queue)s)
FROM axa_worker w
"""


def served() -> str:
    """Why no worker would run a bulk operation now ("" if one would)."""
    with connections[conf.queue_database()].cursor() as cursor:
        cursor.execute(SERVED, {"name": bulkjob.NAME, "queue": bulkjob.QUEUE})
        workers, paused = cursor.fetchone()
    if paused:
        return f"The {bulkjob.QUEUE!r} queue is paused: no worker starts or goes on with bulk operations till resumed."
    if not workers:
        return (
            f"No worker is running that serves the {bulkjob.QUEUE!r} queue: the operation waits until one starts "
            "(python manage.py runworker)."
        )
    return ""


def stalled(op: BulkOperation) -> str:
    """Why a live operation will not go on by itself: its job ended without ending it ("" if not so).

    A job whose workers died under it MAX_LOSSES times fails, or someone cancelled or deleted it.
    """
    if op.status not in LIVE or op.job_id is None:
        return ""
    status = Job.objects.using(conf.queue_database()).filter(pk=op.job_id).values_list("status", flat=True).first()
    if status in (Job.Status.QUEUED, Job.Status.RUNNING, Job.Status.WAITING):
        return ""
    return f"Its job is {status or 'gone'} and will not go on with it: resume it to start a new one."


def badge(status: str) -> SafeString:
    return format_html('<span class="axa-badge axa-{}">{}</span>', BADGES.get(status, status), Status(status).label)


class BulkForm(forms.Form):
    """The operation's pace: rows per batch (each one transaction) and a pause between batches."""

    batch_size = forms.IntegerField(label="Rows per batch", min_value=1, max_value=5000, initial=1000)
    # By default about as long as a batch of 1,000 retries takes: a worker draining beside it
    # kept its speed; with no pause it lost a quarter or more of it (measured on 100,000 retries).
    pause_ms = forms.IntegerField(label="Pause between batches (ms)", min_value=0, max_value=10_000, initial=500)


def shown(count: int | None, estimated: bool) -> str:
    """A confirmation's count as said: "1,234", "about 1,200,000", or uncounted (a search that reads every job)."""
    if count is None:
        return f"all the (not counted within {SEARCH_SECONDS} s)"
    return ("about " if estimated else "") + thousands(count)


@admin.register(BulkOperation)
class BulkOperationAdmin(JobPermissions, admin.ModelAdmin):
    """The bulk operations, newest first; each one's page shows its progress and can cancel it."""

    change_list_template = "admin/axa_django/bulk/change_list.html"
    list_display = ("op_shown", "kind", "filter_shown", "status_shown", "matched", "changed", "skipped_shown")
    list_display += ("started_by", "created_shown", "finished_shown")
    list_filter = ("status", "kind")
    ordering = ("-id",)
    list_per_page = 50
    actions = None

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the record of what was done stays

    def has_kind_permission(self, request: HttpRequest, kind: str) -> bool:
        """May this user run an operation of ``kind``: the per-row action's permission (retry_job, ...)."""
        return self.has_view_permission(request) and self._has(request, kind)

    @admin.display(description="operation", ordering="id")
    def op_shown(self, op: BulkOperation) -> str:
        return f"#{op.pk} {op.kind}"

    @admin.display(description="list and filter")
    def filter_shown(self, op: BulkOperation) -> str:
        return f"{op.list_name}?{op.query}" if op.query else f"{op.list_name} (all)"

    @admin.display(description="status", ordering="status")
    def status_shown(self, op: BulkOperation) -> SafeString:
        return badge(op.status)

    @admin.display(description="skipped")
    def skipped_shown(self, op: BulkOperation) -> int:
        return op.skipped

    @admin.display(description="started", ordering="created_at")
    def created_shown(self, op: BulkOperation) -> SafeString:
        return format_time(op.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished_shown(self, op: BulkOperation) -> SafeString:
        return format_time(op.finished_at)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("start/<str:list_name>/<str:kind>/", wrap(self.start_view), name=f"{info}_start"),
            path("<int:op_id>/data/", wrap(self.data_view), name=f"{info}_data"),
            path("<int:op_id>/cancel/", wrap(self.cancel_view), name=f"{info}_cancel"),
            path("<int:op_id>/resume/", wrap(self.resume_view), name=f"{info}_resume"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        return super().changelist_view(request, {"unserved": served(), **(extra_context or {})})

    # Starting one.

    def start_view(self, request: HttpRequest, list_name: str, kind: str) -> HttpResponse:
        """The confirmation page: what the list's filter matches, and the pace; a valid POST starts it."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        model_admin = bulkjob.list_admin(self.admin_site.name, list_name)
        if kind not in VERBS or model_admin is None:
            raise Http404("No such job list or bulk action.")
        if not self.has_kind_permission(request, kind):
            raise PermissionDenied
        refused = refuse_nul(request.GET, request.POST)
        if refused is not None:
            return refused
        if PAGE_VAR in request.GET:  # the page shown is no part of the filter, and may be gone by the next run
            request.GET = request.GET.copy()
            del request.GET[PAGE_VAR]
        name = self.admin_site.name
        back = reverse(f"admin:axa_django_{list_name}_changelist", current_app=name)
        query = request.GET.urlencode()
        try:
            # The list's own ChangeList, from the list's own query string (this page's), and its
            # count, within the search's bound as the list itself (both count what it matches).
            problem, count, estimated = self.counted(model_admin, request, kind)
        except IncorrectLookupParameters:
            self.message_user(request, "Those filters are not valid; nothing was changed.", messages.ERROR)
            return HttpResponseRedirect(back)
        if problem:  # a malformed search lists nothing: say why rather than offer to change 0 jobs
            self.message_user(request, f"{problem} Nothing was changed.", messages.ERROR)
            return HttpResponseRedirect(f"{back}?{query}" if query else back)
        form = BulkForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid() and count != 0:
            op = self.start(request, list_name, kind, query, count, estimated, form.cleaned_data)
            return self._to_op(op)
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(
                self.admin_site,
                self.opts,
                (back, str(model_admin.opts.verbose_name_plural).capitalize()),
                ("", f"{VERBS[kind]} all matching"),
            ),
            "title": f"{VERBS[kind]} every job this filter matches?",
            "opts": self.opts,
            "kind": kind,
            "verb": VERBS[kind],
            "noun": WHAT[kind][0],
            "purpose": WHAT[kind][1],
            "count": count,
            "count_shown": shown(count, estimated),
            "plural": "" if count == 1 else "s",
            "filters": [(key, value) for key, values in request.GET.lists() for value in values],
            "form": form,
            "unserved": served(),
            "back_url": f"{back}?{query}" if query else back,
        }
        request.current_app = name
        return TemplateResponse(request, "admin/axa_django/bulk/confirmation.html", context)

    def counted(self, model_admin: Any, request: HttpRequest, kind: str) -> tuple[str | None, int | None, bool]:
        """The list's search problem, how many jobs match and whether that is the planner's estimate; the
        count None if not counted within SEARCH_SECONDS (a search no index answers reads every job)."""
        using = conf.queue_database()
        try:
            with transaction.atomic(using=using), connections[using].execute_wrapper(Deadline(SEARCH_SECONDS)):
                changelist = model_admin.get_changelist_instance(request)
                problem = getattr(changelist, "search_problem", None)
                if problem:
                    return problem, 0, False
                jobs = bulkjob.targets(kind, changelist.queryset).order_by()
                paginator = EstimatedCountPaginator(jobs.order_by("pk"), 1)  # it counts unordered
                return None, paginator.count, paginator.estimated
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) != QUERY_CANCELED:
                raise
            return None, None, True

    def start(
        self,
        request: HttpRequest,
        list_name: str,
        kind: str,
        query: str,
        count: int | None,
        estimated: bool,
        pace: Any,
    ) -> BulkOperation:
        using = conf.queue_database()
        with transaction.atomic(using=using):
            op = BulkOperation.objects.using(using).create(
                kind=kind,
                site=self.admin_site.name,
                list_name=list_name,
                query=query,
                user_pk=str(request.user.pk),
                started_by=request.user.get_username(),
                estimate=count or 0,
                estimated=estimated,
                batch_size=pace["batch_size"],
                pause_ms=pace["pause_ms"],
                bound=bulkjob.bound(using),
            )
            op.job_id = bulkjob.bulk_operation.perform_later(operation=op.pk).pk
            op.save(update_fields=["job_id"])
        about = shown(count, estimated)
        text = f"Started: {kind} of {about} jobs matching {list_name}?{query}, {op.batch_size} per batch."
        self.log_addition(request, op, text)
        logger.info("%s by %s (list %s?%s): started on %s jobs", op, op.started_by, list_name, query, about)
        return op

    # Its progress.

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The progress page: counts, status, who and when; it refreshes itself while the operation is live."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        op = self.get_object(request, object_id)
        if op is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        name = self.admin_site.name
        back = reverse(f"admin:axa_django_{op.list_name}_changelist", current_app=name)
        may = self.has_kind_permission(request, op.kind)
        stuck = stalled(op)
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(
                self.admin_site,
                self.opts,
                (reverse("admin:axa_django_bulkoperation_changelist", current_app=name), "Bulk operations"),
                ("", f"#{op.pk} {op.kind}"),
            ),
            "title": f"Bulk {op.kind} #{op.pk}",
            "opts": self.opts,
            "op": op,
            "figures": figures(op),
            "badge": badge(op.status),
            "filters": [(key, value) for key, values in QueryDict(op.query).lists() for value in values],
            "list_url": f"{back}?{op.query}" if op.query else back,
            "list_label": LABELS.get(op.list_name, op.list_name),
            "job_url": reverse("admin:axa_django_job_change", args=[op.job_id], current_app=name) if op.job_id else "",
            "created": full_time(op.created_at),
            "finished": full_time(op.finished_at),
            "can_cancel": may and op.status in LIVE and not op.cancel_requested,
            "can_resume": may and (op.status == Status.FAILED or bool(stuck)),
            "cancel_url": reverse("admin:axa_django_bulkoperation_cancel", args=[op.pk], current_app=name),
            "resume_url": reverse("admin:axa_django_bulkoperation_resume", args=[op.pk], current_app=name),
            "data_url": reverse("admin:axa_django_bulkoperation_data", args=[op.pk], current_app=name),
            "refresh_seconds": dashboard.refresh_seconds(request.GET.get("refresh", str(REFRESH_SECONDS))),
            "unserved": stuck or (served() if op.status in LIVE else ""),
        }
        request.current_app = name
        return TemplateResponse(request, "admin/axa_django/bulk/progress.html", context)

    @method_decorator(never_cache)
    def data_view(self, request: HttpRequest, op_id: int) -> HttpResponse:
        """The progress page's poll: the operation's figures as JSON."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            return JsonResponse({"error": "you may not view jobs"}, status=403)
        op = BulkOperation.objects.using(conf.queue_database()).filter(pk=op_id).first()
        if op is None:
            return JsonResponse({"error": "no such bulk operation"}, status=404)
        return JsonResponse(
            {
                **figures(op),
                "status": op.status,
                "status_label": Status(op.status).label,
                "live": op.status in LIVE,
                "cancel_requested": op.cancel_requested,
                "error": op.error,
                "finished": full_time(op.finished_at),
                "unserved": stalled(op) or (served() if op.status in LIVE else ""),
            }
        )

    def cancel_view(self, request: HttpRequest, op_id: int) -> HttpResponse:
        """Stop a live operation: at once if no worker started it, else at its next batch."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        op = self._post_target(request, op_id)
        using = conf.queue_database()
        with transaction.atomic(using=using):
            op = BulkOperation.objects.using(using).select_for_update().get(pk=op.pk)
            if op.status not in LIVE or op.cancel_requested:
                text = f"Bulk {op.kind} #{op.pk} is {op.status}; there is nothing to cancel."
                self.message_user(request, text, messages.WARNING)
                return self._to_op(op)
            op.cancel_requested, op.cancelled_by, op.updated_at = True, request.user.get_username(), Now()
            if op.status == Status.QUEUED:  # no worker began it: it ends here, and its job with it
                op.status, op.finished_at = Status.CANCELLED, Now()
                Job.objects.using(using).filter(pk=op.job_id).cancel()
            op.save(update_fields=["cancel_requested", "cancelled_by", "status", "finished_at", "updated_at"])
        if op.status == Status.CANCELLED:
            text = f"Bulk {op.kind} #{op.pk} was cancelled before it started."
        else:
            text = f"Bulk {op.kind} #{op.pk} stops at its next batch; what it changed so far stays changed."
        self.log_change(request, op, text)
        logger.info("%s: cancel asked by %s", op, request.user.get_username())
        self.message_user(request, text, messages.SUCCESS)
        return self._to_op(op)

    def resume_view(self, request: HttpRequest, op_id: int) -> HttpResponse:
        """Run a failed operation (or one its job left) again from where it stopped."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        op = self._post_target(request, op_id)
        using = conf.queue_database()
        with transaction.atomic(using=using):
            op = BulkOperation.objects.using(using).select_for_update().get(pk=op.pk)
            if op.status != Status.FAILED and not stalled(op):
                text = f"Bulk {op.kind} #{op.pk} is {op.status}, not failed nor left by its job."
                self.message_user(request, text, messages.WARNING)
                return self._to_op(op)
            op.status, op.error, op.finished_at, op.updated_at = Status.QUEUED, "", None, Now()
            op.job_id = bulkjob.bulk_operation.perform_later(operation=op.pk).pk
            op.save(update_fields=["status", "error", "finished_at", "updated_at", "job_id"])
        text = f"Resumed: bulk {op.kind} #{op.pk} goes on after id {op.position}."
        self.log_change(request, op, text)
        logger.info("%s: resumed by %s", op, request.user.get_username())
        self.message_user(request, text, messages.SUCCESS)
        return self._to_op(op)

    def _post_target(self, request: HttpRequest, op_id: int) -> BulkOperation:
        op = BulkOperation.objects.using(conf.queue_database()).filter(pk=op_id).first()
        if op is None:
            raise Http404("No such bulk operation.")
        if not self.has_kind_permission(request, op.kind):
            raise PermissionDenied
        return op

    def _to_op(self, op: BulkOperation) -> HttpResponse:
        url = reverse("admin:axa_django_bulkoperation_change", args=[op.pk], current_app=self.admin_site.name)
        return HttpResponseRedirect(url)


def figures(op: BulkOperation) -> dict[str, str]:
    """The counts of ``op`` as the page shows them."""
    return {
        "estimate": ("about " if op.estimated else "") + thousands(op.estimate),
        "matched": thousands(op.matched),
        "changed": thousands(op.changed),
        "skipped": thousands(op.skipped),
        "skipped_gone": thousands(op.skipped_gone),
        "skipped_key": thousands(op.skipped_key),
        "skipped_refused": thousands(op.skipped_refused),
        "skipped_busy": thousands(op.skipped_busy),
        "held_now": thousands(len(op.busy)),
        "batches": thousands(op.batches),
    }
