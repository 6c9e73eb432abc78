"""How the job admin shows values: status badges, durations, times, error lines, JSON and counts."""

from __future__ import annotations

import datetime
import json
from typing import Any

from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from ..models import Job

STATUS_ICONS = {
    Job.Status.WAITING: "\u2026",  # ellipsis: in every font, where U+29D6 (an hourglass) often shows as a box
    Job.Status.QUEUED: "\u25f7",  # clock
    Job.Status.RUNNING: "\u25b6",  # play
    Job.Status.COMPLETED: "\u2714",  # check
    Job.Status.FAILED: "\u2716",  # cross
    Job.Status.CANCELLED: "\u2298",  # slashed circle
}


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
        try:
            return timezone.localtime(value)
        except OverflowError:  # a row's time at the edge of what Python holds (OutOfRange): shown in UTC
            return value
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


# A list cell holds this many characters of an error's first line; the job page has it all.
ERROR_CELL_CHARS = 100


def short_error(line: str, limit: int = ERROR_CELL_CHARS) -> str:
    """``line`` cut to ``limit`` characters, an ellipsis marking the cut."""
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "\u2026"


def thousands(value: int) -> str:
    """``value`` with comma thousands separators, whatever the locale: 300,000."""
    return f"{value:,}"


def yes_no(value: bool) -> str:
    """A boolean as a plain word, so "no" does not read as an error."""
    return "yes" if value else "no"


class JobPermissions:
    """A read-only admin governed by Job's permissions (also when it serves a proxy or another model)."""

    def _has(self, request: HttpRequest, action: str) -> bool:
        return request.user.has_perm(f"{Job._meta.app_label}.{action}_{Job._meta.model_name}")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._has(request, "view") or self._has(request, "change")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # read-only; state changes go through the actions (retry, cancel)


class LivePage:
    """A console page that changes nothing through the admin's own forms: no add, change or delete,
    its index entry shown to whoever may view it, and a page, its poll (``data/``) and one POST view."""

    post_path = ""  # the POST view's path and URL name, e.g. "stop"

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)  # type: ignore[attr-defined,no-any-return]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"  # type: ignore[attr-defined]
        wrap = self.admin_site.admin_view  # type: ignore[attr-defined]
        urls = [
            path("", wrap(self.changelist_view), name=f"{info}_changelist"),  # type: ignore[attr-defined]
            path("data/", wrap(self.data_view), name=f"{info}_data"),  # type: ignore[attr-defined]
        ]
        if self.post_path:
            urls.append(
                path(f"{self.post_path}/", wrap(self.post_view), name=f"{info}_{self.post_path}")  # type: ignore[attr-defined]
            )
        return urls

    def _url(self, name: str) -> str:
        opts, site = self.opts, self.admin_site  # type: ignore[attr-defined]
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_{name}", current_app=site.name)
