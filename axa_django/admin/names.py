"""The Job names page: per job name, jobs run, failed and retried and run times over the last hour and day.

A table sortable by each column (``?o=day_p95``, ``?o=-day_p95``), the slowest and the most
failing names at a glance, and a page per name with its jobs per hour over the day. Read
only: seeing it needs ``axa_django.view_job``, as the dashboard.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from ..models import JobNames
from ..ops import dashboard, names
from .actions import breadcrumbs
from .display import JobPermissions, format_duration, local_time, thousands
from .lists import refuse_nul

PER_PAGE = 100
TOP = 5  # names in each "at a glance" box
DEFAULT_ORDER = "-day_run"
# Each window's columns: key in ``?o=``, header, Window attribute.
FIGURES = (
    ("run", "Run", "run"),
    ("failed", "Failed", "failed"),
    ("retried", "Retried", "retried"),
    ("p50", "p50", "p50"),
    ("p95", "p95", "p95"),
    ("max", "Max", "longest"),
)


@dataclass(frozen=True)
class Column:
    """A sortable column: its key in ``?o=``, its header, and the value it sorts by."""

    key: str
    label: str
    value: Callable[[names.NameFigures], Any]


def _columns() -> list[Column]:
    found = [Column("name", "Name", attrgetter("name"))]
    for window in ("hour", "day"):
        for key, label, field in FIGURES:
            found.append(Column(f"{window}_{key}", label, attrgetter(f"{window}.{field}")))
    return found


COLUMNS = {column.key: column for column in _columns()}


def sort_rows(rows: list[names.NameFigures], order: str) -> list[names.NameFigures]:
    """``rows`` by the column ``order`` names (``-`` first: descending); names without a value last, ties by name."""
    column = COLUMNS[order.lstrip("-")]
    descending = order.startswith("-")
    by_name = sorted(rows, key=lambda f: f.name)
    if column.key == "name":
        return list(reversed(by_name)) if descending else by_name
    present = [f for f in by_name if column.value(f) is not None]
    missing = [f for f in by_name if column.value(f) is None]
    # sorted() is stable, also reversed: ties keep the names' order.
    return sorted(present, key=column.value, reverse=descending) + missing


def _duration(seconds: float | None) -> str:
    return format_duration(datetime.timedelta(seconds=seconds)) if seconds is not None else "-"


@admin.register(JobNames)
class JobNamesAdmin(JobPermissions, admin.ModelAdmin):
    """Per job name metrics over the last hour and day, and a chart per name."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{info}_changelist"),
            path("name/", self.admin_site.admin_view(self.name_view), name=f"{info}_name"),
        ]

    def _links(self) -> dict[str, str]:
        site = self.admin_site.name
        return {
            "jobs_url": reverse("admin:axa_django_job_changelist", current_app=site),
            "failed_url": reverse("admin:axa_django_failedjob_changelist", current_app=site),
            "names_url": reverse("admin:axa_django_jobnames_changelist", current_app=site),
            "name_url": reverse("admin:axa_django_jobnames_name", current_app=site),
        }

    def _row(self, figures: names.NameFigures, links: dict[str, str]) -> dict[str, Any]:
        query = urlencode({"name": figures.name})
        cells = []
        for window in (figures.hour, figures.day):
            cells += [
                thousands(window.run),
                thousands(window.failed),
                thousands(window.retried),
                _duration(window.p50),
                _duration(window.p95),
                _duration(window.longest),
            ]
        return {
            "figures": figures,
            "jobs_url": f"{links['jobs_url']}?{query}",
            "failed_url": f"{links['failed_url']}?{query}",
            "chart_url": f"{links['name_url']}?{query}",
            "cells": cells,
            "day_completed": thousands(figures.day.completed),
            "failed_share": f"{figures.day.failed / figures.day.run:.0%}" if figures.day.run else "-",
        }

    def _context(self, request: HttpRequest, figures: names.Figures, took: float, *crumbs: tuple[str, str]) -> Any:
        return {
            **self.admin_site.each_context(request),
            **breadcrumbs(self.admin_site, self.opts, *crumbs),
            "opts": self.opts,
            "now": local_time(figures.now),
            "hour_from": local_time(figures.hour_from),
            "day_from": local_time(figures.day_from),
            "took_ms": f"{took * 1000:.0f}",
            "error_percent": f"{names.ERROR:.1%}",
            "lowest_ms": f"{names.LOWEST * 1000:g}",
            "half_lowest_ms": f"{names.LOWEST * 500:g}",
            **self._links(),
        }

    @method_decorator(never_cache)
    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        order = request.GET.get("o", DEFAULT_ORDER)
        if order.lstrip("-") not in COLUMNS or order.count("-") > 1:
            messages.warning(
                request, f"There is no column {order!r} to sort by; sorted by jobs run in the last day instead."
            )
            order = DEFAULT_ORDER
        asked_page = request.GET.get("p", "1")
        page = int(asked_page) if asked_page.isascii() and asked_page.isdigit() else 0  # int("²") raises
        started = time.perf_counter()
        figures = names.collect()
        took = time.perf_counter() - started
        rows = sort_rows(figures.names, order)
        pages = max(1, -(-len(rows) // PER_PAGE))
        if not 1 <= page <= pages:
            messages.warning(request, f"There is no page {asked_page!r} (pages 1 to {pages}); showing page 1.")
            page = 1
        links = self._links()
        slowest = sorted((f for f in rows if f.day.p95 is not None), key=lambda f: (-(f.day.p95 or 0), f.name))
        failing = sorted((f for f in rows if f.day.failed), key=lambda f: (-f.day.failed, f.name))
        context = {
            **self._context(request, figures, took, ("", "Job names")),
            "title": "Job names",
            "headers": self._headers(order),
            "rows": [self._row(f, links) for f in rows[(page - 1) * PER_PAGE : page * PER_PAGE]],
            "count": thousands(len(rows)),
            "total": len(rows),
            "slowest": [self._row(f, links) for f in slowest[:TOP]],
            "failing": [self._row(f, links) for f in failing[:TOP]],
            "pages": [(n, "?" + urlencode({"o": order, "p": n})) for n in range(1, pages + 1)] if pages > 1 else [],
            "page": page,
            "reload_url": "?" + urlencode({"o": order, "p": page}),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/names.html", context)

    def _headers(self, order: str) -> list[dict[str, Any]]:
        headers = []
        for key, column in COLUMNS.items():
            current = order.lstrip("-") == key
            descending = order.startswith("-")
            # A click on the current column turns it round; a new column starts with the
            # most (the slowest, the most failures), names from A.
            fresh = key if key == "name" else f"-{key}"
            target = (key if descending else f"-{key}") if current else fresh
            headers.append(
                {
                    "key": key,
                    "label": column.label,
                    "url": "?" + urlencode({"o": target}),
                    "sorted": ("descending" if descending else "ascending") if current else "",
                }
            )
        return headers

    @method_decorator(never_cache)
    def name_view(self, request: HttpRequest) -> HttpResponse:
        """One name's figures and its jobs per hour over the day (``?name=``)."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        refused = refuse_nul(request.GET)
        if refused is not None:
            return refused
        name = request.GET.get("name", "")
        started = time.perf_counter()
        figures = names.collect([name], hourly=True)
        took = time.perf_counter() - started
        found = figures.names[0] if figures.names else None
        if found is None:
            messages.warning(request, f"No job named {name!r} finished in the last day.")
        links = self._links()
        context = {
            **self._context(request, figures, took, (links["names_url"], "Job names"), ("", name or "(no name)")),
            "title": f"Job name {name}",
            "name": name,
            "row": self._row(found, links) if found else None,
            "chart": dashboard.chart_svg(found.hours) if found else None,
            "reload_url": "?" + urlencode({"name": name}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/axa_django/name.html", context)
