"""The periodic jobs page: every cron entry with its schedule in words, its last and next run, the live
workers that run it, and enable/disable (``axa_django.change_schedule``).

Seeing the page needs Job's view permission or Schedule's. It reads the registry, the
entries' rows of ``axa_schedule`` and the live workers (small tables), and each last run
by its id (``axa_schedule.last_job_id``): never a walk of the history.
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from .. import cron, registry
from ..enqueuing.cronexpr import describe
from ..models import Job
from ..models.queue import PeriodicJob, Schedule
from ..sql import LIVE as LIVE_LEASE
from .actions import breadcrumbs
from .display import format_duration, full_time, status_badge, thousands
from .lists import refuse_nul
from .timeline import database_now

logger = logging.getLogger("axa_django")

PERMISSION = "axa_django.change_schedule"
VIEWERS = ("axa_django.view_job", "axa_django.change_job", "axa_django.view_schedule", PERMISSION)

# Workers within their lease, and the job names each claims (axa_worker is one row per process).
LIVE = f"""
SELECT hostname, pid, names, queues FROM axa_worker w
WHERE {LIVE_LEASE}
ORDER BY started_at, id
"""


@dataclass
class Entry:
    """One periodic job as the page shows it."""

    name: str
    expression: str
    words: str
    queue: str
    enabled: bool
    last_job: tuple[uuid.UUID, str, datetime.datetime | None] | None = None  # id, status, its time
    last_job_gone: bool = False  # its job was deleted or pruned since
    next_run: datetime.datetime | None = None  # in the cron time zone
    next_in: str = ""
    time_zone: str = ""
    workers: list[str] = field(default_factory=list)


def _names(value: Any) -> list[str]:
    """A JSON list of names as a cursor gives it (Django's leaves jsonb as text), anything else as none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [str(item) for item in value] if isinstance(value, list) else []


def entries(using: str, now: datetime.datetime) -> list[Entry]:
    """Every registered periodic job, with its row of axa_schedule, last run, next run and live workers."""
    jobs = cron.scheduled_jobs()
    if not jobs:
        return []
    rows = {s.name: s for s in Schedule.objects.using(using).filter(name__in=[job.name for job in jobs])}
    last_ids = [row.last_job_id for row in rows.values() if row.last_job_id]
    last = {
        pk: (pk, status, finished or created)
        for pk, status, created, finished in Job.objects.using(using)
        .filter(pk__in=last_ids)
        .order_by()
        .values_list("id", "status", "created_at", "finished_at")
    }
    with connections[using].cursor() as cursor:
        cursor.execute(LIVE)
        live = [(f"{host} pid {pid}", _names(names), _names(queues)) for host, pid, names, queues in cursor.fetchall()]
    zone = str(cron.timezone())
    found = []
    for job in jobs:
        row = rows.get(job.name)
        entry = Entry(
            name=job.name,
            expression=str(job.cron),
            words=describe(str(job.cron)),
            queue=job.options.queue,
            enabled=row.enabled if row is not None else True,
            workers=[
                w for w, names, queues in live if job.name in names and (not queues or job.options.queue in queues)
            ],
        )
        if row is not None and row.last_job_id:
            entry.last_job = last.get(row.last_job_id)
            entry.last_job_gone = entry.last_job is None
        if entry.enabled:
            entry.next_run = cron.next_runs(job, 1, after=now)[0]
            entry.next_in = format_duration(entry.next_run - now)
        entry.time_zone = zone
        found.append(entry)
    return found


@admin.register(PeriodicJob)
class PeriodicJobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Periodic jobs: the list, and enable/disable behind ``axa_django.change_schedule``."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return any(request.user.has_perm(name) for name in VIEWERS)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the schedule is code's; enable/disable is the toggle below

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_toggle_permission(self, request: HttpRequest) -> bool:
        """May this user enable and disable periodic jobs (``axa_django.change_schedule``)."""
        return request.user.has_perm(PERMISSION)

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name=f"{info}_changelist"),
            path("toggle/", wrap(self.toggle_view), name=f"{info}_toggle"),
        ]

    def _back(self) -> HttpResponse:
        return HttpResponseRedirect(
            reverse("admin:axa_django_periodicjob_changelist", current_app=self.admin_site.name)
        )

    def toggle_view(self, request: HttpRequest) -> HttpResponse:
        """Enable or disable one periodic job (POST ``name`` and ``enabled`` = "on" or "off")."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        refused = refuse_nul(request.GET, request.POST)
        if refused is not None:
            return refused
        if not (self.has_view_permission(request) and self.has_toggle_permission(request)):
            raise PermissionDenied
        name, wanted = request.POST.get("name", ""), request.POST.get("enabled", "")
        job = registry.registry.get(name)
        if job is None or job.cron is None:
            self.message_user(
                request, f"No periodic job named {name!r} is registered; nothing changed.", messages.ERROR
            )
            return self._back()
        if wanted not in ("on", "off"):
            self.message_user(request, f"Say enabled=on or off, not {wanted!r}; nothing changed.", messages.ERROR)
            return self._back()
        enable = wanted == "on"
        if not cron.set_enabled(job, enable):
            state = "enabled" if enable else "disabled"
            self.message_user(request, f"Periodic job {name} was already {state}; nothing changed.", messages.WARNING)
            return self._back()
        done = "enabled" if enable else "disabled"
        logger.info("%s %s periodic job %s (1 schedule changed)", request.user, done, name)
        row = PeriodicJob.objects.get(pk=name)
        if enable:
            text = f"Enabled: next run at its next occurrence after {full_time(row.last_run)}; missed ones skipped."
            shown = f"Periodic job {name} enabled: it runs again from its next occurrence (those missed are skipped)."
        else:
            text = "Disabled: workers enqueue none of its occurrences until it is enabled again."
            shown = f"Periodic job {name} disabled: no worker enqueues it until it is enabled again."
        self.log_change(request, row, text)
        self.message_user(request, shown, messages.SUCCESS)
        return self._back()

    @method_decorator(never_cache)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        using = Job.objects.db
        now = database_now(using)
        found = entries(using, now)
        site = self.admin_site.name
        rows = [
            (
                entry,
                status_badge(entry.last_job[1]) if entry.last_job else "",
                reverse("admin:axa_django_job_change", args=[entry.last_job[0]], current_app=site)
                if entry.last_job
                else "",
                full_time(entry.last_job[2]) if entry.last_job else "",
                f"{entry.next_run:%Y-%m-%d %H:%M:%S}" if entry.next_run else "",
            )
            for entry in found
        ]
        context = {
            **self.admin_site.each_context(request),
            **breadcrumbs(self.admin_site, self.opts, ("", "Periodic jobs")),
            "title": "Periodic jobs",
            "opts": self.opts,
            "rows": rows,
            "count": thousands(len(found)),
            "disabled": sum(1 for entry in found if not entry.enabled),
            "now": full_time(now),
            "can_toggle": self.has_toggle_permission(request),
            "toggle_url": reverse("admin:axa_django_periodicjob_toggle", current_app=site),
            **(extra_context or {}),
        }
        request.current_app = site
        return TemplateResponse(request, "admin/axa_django/periodic.html", context)
