"""The Workers page ("Busy"): every live worker, what each of its threads runs and for how long, and a graceful stop.

Seeing it needs ``axa_django.view_job`` (as the dashboard) or ``stop_worker``; asking a
worker to stop needs ``axa_django.stop_worker``. The request is a column of the
worker's row that its heartbeat reads back on the connection it already holds: at its
next beat (a third of its lease) it stops as on SIGTERM, its running jobs finishing.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from ..models.queue import LiveWorker
from ..ops import dashboard, fleetview
from .actions import breadcrumbs
from .display import LivePage, format_duration, local_time, thousands
from .lists import refuse_nul

logger = logging.getLogger("axa_django")

PERMISSION = "axa_django.stop_worker"
# Job names (and task backends) a worker's cell names; past this many it counts them.
NAMES_SHOWN = 3


def _ago(seconds: float | None) -> str:
    return format_duration(datetime.timedelta(seconds=seconds)) if seconds is not None else "-"


def _some(items: list[str], what: str) -> str:
    # A few are named; more are counted (the cell's title lists them all).
    return ", ".join(items) if len(items) <= NAMES_SHOWN else f"{len(items):,} {what}"


def shown(worker: fleetview.WorkerRow, job_url: str) -> dict[str, Any]:
    """One worker as the page shows it (the template and the poll's JSON alike).

    ``job_url`` is a job page's URL for the zero id, whose id each job's link replaces.
    """
    runs = _some(worker.names, "job names") if worker.names else "no job names"
    if worker.backends:
        runs += f"; task backends {_some(worker.backends, 'backends')}"
    stopping = ""
    if worker.stop_requested_by is not None:
        stopping = f"asked by {worker.stop_requested_by or 'someone'} {_ago(worker.stop_requested_seconds)} ago"
    zero = str(uuid.UUID(int=0))
    return {
        "label": f"{worker.hostname}:{worker.pid}",
        "queues": ", ".join(worker.queues) or "all",
        "runs": runs,
        "runs_title": "\n".join([*worker.names, *(f"task backend {b}" for b in worker.backends)]),
        "busy": f"{worker.busy:,} of {worker.concurrency:,}",
        "waiting": thousands(worker.running - worker.busy),
        "up": _ago(worker.uptime),
        "started": local_time(worker.started_at).isoformat(" ", "seconds"),
        "heartbeat": f"{_ago(worker.heartbeat_age)} ago",
        "stopping": stopping,
        "jobs": [
            {
                "id": job.id,
                "name": job.name,
                "url": job_url.replace(zero, job.id),
                "queue": job.queue,
                "attempt": job.attempt,
                "since": local_time(job.started_at).strftime("%H:%M:%S") if job.started_at else "",
                "since_title": local_time(job.started_at).isoformat(" ") if job.started_at else "",
                "running": _ago(job.seconds) if job.started_at else "claimed ahead, waiting for a thread",
            }
            for job in worker.jobs
        ],
    }


def summary(snapshot: fleetview.Workers) -> str:
    """The fleet in one line: workers, threads, busy threads."""
    live = snapshot.workers
    threads = sum(w.concurrency for w in live)
    busy = sum(w.busy for w in live)
    return f"{len(live):,} live worker{'s' if len(live) != 1 else ''}, {threads:,} threads, {busy:,} busy."


@admin.register(LiveWorker)
class WorkersAdmin(LivePage, admin.ModelAdmin):  # type: ignore[type-arg]
    """The Workers page: live workers with their running jobs, and a POST view asking one to stop."""

    post_path = "stop"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(user.has_perm(f"axa_django.{name}") for name in ("view_job", "change_job", "stop_worker"))

    def has_stop_permission(self, request: HttpRequest) -> bool:
        """May this user ask a worker to stop (``axa_django.stop_worker``)."""
        return request.user.has_perm(PERMISSION)

    def _job_url(self) -> str:
        return reverse("admin:axa_django_job_change", args=[uuid.UUID(int=0)], current_app=self.admin_site.name)

    @method_decorator(never_cache)
    def data_view(self, request: HttpRequest) -> HttpResponse:
        """The live page's poll: every live worker as JSON."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            return JsonResponse({"error": "you may not view workers"}, status=403)
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        started = time.perf_counter()
        snapshot = fleetview.workers()
        data = snapshot.as_dict()
        job_url = self._job_url()
        for entry, worker in zip(data["workers"], snapshot.workers, strict=True):
            entry["shown"] = shown(worker, job_url)
        data["summary"] = summary(snapshot)
        data["took_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return JsonResponse(data)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        snapshot = fleetview.workers()
        job_url = self._job_url()
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(self.admin_site, self.opts, ("", "Workers")),
            "title": "Workers",
            "opts": self.opts,
            "rows": [(worker, shown(worker, job_url)) for worker in snapshot.workers],
            "snapshot": snapshot,
            "summary": summary(snapshot),
            "can_stop": self.has_stop_permission(request),
            "data_url": self._url("data"),
            "stop_url": self._url("stop"),
            "refresh_seconds": dashboard.refresh_seconds(request.GET.get("refresh")),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/workers.html", context)

    def post_view(self, request: HttpRequest) -> HttpResponse:
        """Ask one live worker to stop gracefully (POST, ``stop_worker``); then back to the page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_stop_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.POST)
        if refused is not None:
            return refused
        back = HttpResponseRedirect(self._url("changelist"))
        try:
            worker_id = str(uuid.UUID(request.POST.get("worker", "")))
        except ValueError:
            self.message_user(request, "No worker was asked to stop: the request named none.", messages.ERROR)
            return back
        who = request.user.get_username()
        answer = fleetview.request_stop(worker_id, who)
        if answer.outcome == "asked":
            logger.info("worker %s (%s): asked to stop from the admin by %s (1 worker)", worker_id, answer.label, who)
            host, _, pid = answer.label.rpartition(":")
            self.log_change(request, LiveWorker(id=worker_id, hostname=host, pid=int(pid)), "Asked to stop.")
            text = (
                f"Worker {answer.label} was asked to stop: at its next heartbeat it claims no more jobs, "
                "finishes those it runs and exits."
            )
            self.message_user(request, text, messages.SUCCESS)
        elif answer.outcome == "already":
            text = f"Worker {answer.label} was already asked to stop (by {answer.by}); it stops at its next heartbeat."
            self.message_user(request, text, messages.WARNING)
        elif answer.outcome == "dead":
            text = f"Worker {answer.label} was not asked to stop: its lease has run out (it is presumed dead)."
            self.message_user(request, text, messages.WARNING)
        else:
            self.message_user(request, "That worker is no longer running: nothing to stop.", messages.WARNING)
        return back
