"""The Queues page: every queue's figures, live, and its controls (pause, resume, set or lift its limit).

Seeing it needs ``axa_django.view_job`` (as the dashboard), ``view_queuepause`` or
``pause_queue``; every control needs ``axa_django.pause_queue`` (a limit is a partial
pause: the same permission). Each goes through ``axa_django.queues``, which wakes the
workers, and is logged (the ``axa_django`` logger, INFO) and kept in the admin's history.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from .. import queues
from ..models.queue import Queue
from ..ops import dashboard, fleetview
from ..selection import check_queue
from .actions import breadcrumbs
from .display import LivePage, format_duration, local_time, short_error, thousands
from .lists import refuse_nul

logger = logging.getLogger("axa_django")

PERMISSION = "axa_django.pause_queue"
ACTIONS = {"pause": "Pause", "resume": "Resume", "limit": "Set limit", "unlimit": "Lift limit"}
# The form's fields as the page names them, in its error messages.
LABELS = {"do": "Action", "queue": "Queue", "reason": "Reason", "max_running": "At most running"}


class QueueActionForm(forms.Form):
    """One control: what to do, to which queue, with its reason or its limit; checked as ``queues`` checks them."""

    do = forms.ChoiceField(choices=list(ACTIONS.items()))
    queue = forms.CharField(strip=False, max_length=1000)
    reason = forms.CharField(required=False, strip=False)
    max_running = forms.IntegerField(required=False, min_value=1, max_value=queues.MAX_RUNNING)

    def clean_queue(self) -> str:
        try:
            return check_queue(self.cleaned_data["queue"])
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None

    def clean_reason(self) -> str:
        try:
            return queues._reason(self.cleaned_data.get("reason") or "")
        except (TypeError, ValueError) as error:
            raise forms.ValidationError(str(error)) from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("do") == "limit" and cleaned.get("max_running") is None and "max_running" not in self.errors:
            self.add_error("max_running", "Give how many of the queue's jobs may run at once (1 or more).")
        return cleaned


def _ago(seconds: float | None) -> str:
    return format_duration(datetime.timedelta(seconds=seconds)) if seconds is not None else "-"


def shown(row: fleetview.QueueRow) -> dict[str, Any]:
    """One queue's figures as the page shows them (the template and the poll's JSON alike)."""
    paused = ""
    if row.paused:
        paused = f"by {row.paused_by or 'someone'}, {_ago(row.paused_seconds)} ago"
        if row.reason:
            paused += f": {short_error(' '.join(row.reason.split()))}"
    return {
        "ready": ("at least " if row.ready_capped else "") + thousands(row.ready),
        "scheduled": ("at least " if row.scheduled_capped else "") + thousands(row.scheduled),
        "running": thousands(row.running),
        "oldest": _ago(row.oldest_ready_seconds) if row.oldest_ready_seconds is not None else "-",
        "per_minute": f"{row.per_minute:,.1f}",
        "failed": thousands(row.failed),
        "limit": f"at most {row.max_running:,} running" if row.max_running is not None else "-",
        "limit_title": f"set by {row.limit_set_by}" if row.limit_set_by else "",
        "workers": thousands(len(row.workers)),
        "workers_title": ", ".join(row.workers),
        "state": "paused" if row.paused else "active",
        "paused": paused,
        "paused_title": (
            f"{local_time(row.paused_at).isoformat(' ', 'seconds')}: {row.reason}" if row.paused_at else ""
        ),
    }


def span_said(snapshot: fleetview.Queues) -> str:
    """Over what the throughput was counted, in words."""
    if snapshot.span_capped:
        newest = thousands(fleetview.THROUGHPUT_CAP)
        return f"the last {_ago(snapshot.span_seconds)} (the newest {newest} finished jobs)"
    return f"the last {fleetview.WINDOW.total_seconds() / 60:g} minutes"


def poll(snapshot: fleetview.Queues, took: float) -> dict[str, Any]:
    """The page's poll: each queue's raw figures and, under ``shown``, its cells."""
    data = snapshot.as_dict()
    for entry, row in zip(data["queues"], snapshot.queues, strict=True):
        entry["shown"] = shown(row)
    data["span"] = span_said(snapshot)
    data["took_ms"] = round(took * 1000, 1)
    return data


@admin.register(Queue)
class QueuesAdmin(LivePage, admin.ModelAdmin):  # type: ignore[type-arg]
    """The Queues page: a list with live figures, and a POST view for its controls."""

    post_path = "action"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(
            user.has_perm(f"axa_django.{name}") for name in ("view_job", "change_job", "view_queuepause", "pause_queue")
        )

    def has_pause_permission(self, request: HttpRequest) -> bool:
        """May this user pause, resume and limit queues (``axa_django.pause_queue``)."""
        return request.user.has_perm(PERMISSION)

    @method_decorator(never_cache)
    def data_view(self, request: HttpRequest) -> HttpResponse:
        """The live page's poll: every queue's figures as JSON."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            return JsonResponse({"error": "you may not view queues"}, status=403)
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        started = time.perf_counter()
        return JsonResponse(poll(fleetview.queues(), time.perf_counter() - started))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None, form: QueueActionForm | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        snapshot = fleetview.queues()
        asked = request.GET.get("queue", "")
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(self.admin_site, self.opts, ("", "Queues")),
            "title": "Queues",
            "opts": self.opts,
            "rows": [(row, shown(row)) for row in snapshot.queues],
            "span": span_said(snapshot),
            "can_act": self.has_pause_permission(request),
            "form": form,
            "form_errors": [
                f"{LABELS.get(name, name)}: {error}" if name in LABELS else str(error)
                for name, errors in (form.errors.items() if form is not None else [])
                for error in errors
            ],
            "prefill": asked if form is None else form.data.get("queue", ""),
            "data_url": self._url("data"),
            "action_url": self._url("action"),
            "refresh_seconds": dashboard.refresh_seconds(request.GET.get("refresh")),
            "jobs_url": reverse("admin:axa_django_job_changelist", current_app=self.admin_site.name),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/queues.html", context, status=400 if form else 200)

    def post_view(self, request: HttpRequest) -> HttpResponse:
        """Pause, resume, limit or unlimit one queue (POST, ``pause_queue``); then back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.POST)
        if refused is not None:
            return refused
        form = QueueActionForm(request.POST)
        if not form.is_valid():
            return self.changelist_view(request, form=form)
        do, name = form.cleaned_data["do"], form.cleaned_data["queue"]
        who = request.user.get_username()
        said, level, changed = self._act(do, name, who, form.cleaned_data)
        if changed:
            logger.info("queue %r: %s from the admin by %s (1 queue)", name, changed, who)
            self.log_change(request, Queue(queue=name), changed[0].upper() + changed[1:] + ".")
        self.message_user(request, said, level)
        return HttpResponseRedirect(self._url("changelist"))

    @staticmethod
    def _act(do: str, name: str, who: str, data: dict[str, Any]) -> tuple[str, int, str]:
        """Run one control: (the message, its level, what changed in words, empty if nothing did)."""
        if do == "pause":
            reason = data["reason"]
            said_reason = f" (reason: {reason!r})" if reason else ""
            if queues.pause(name, reason, by=who):
                text = f"Queue {name!r} paused: no worker claims its jobs until it is resumed; running jobs finish."
                return text, messages.SUCCESS, f"paused{said_reason}"
            return (
                f"Queue {name!r} was already paused; its reason is updated.",
                messages.SUCCESS,
                (f"pause reason updated{said_reason}"),
            )
        if do == "resume":
            if queues.resume(name):
                return f"Queue {name!r} resumed; idle workers were woken.", messages.SUCCESS, "resumed"
            return f"Queue {name!r} was not paused: nothing changed.", messages.WARNING, ""
        if do == "limit":
            wanted = data["max_running"]
            before = queues.limit(name, wanted, by=who)
            was = f"it was {before:,}" if before is not None else "it had no limit"
            text = f"Queue {name!r}: at most {wanted:,} of its jobs run at once across all workers ({was})."
            return text, messages.SUCCESS, f"limit set to {wanted} running ({was})"
        before = queues.unlimit(name)
        if before is None:
            return f"Queue {name!r} had no limit: nothing changed.", messages.WARNING, ""
        return (
            f"Queue {name!r}: its limit of {before:,} running is lifted.",
            messages.SUCCESS,
            (f"limit of {before} running lifted"),
        )
