"""The admin of workflows and batches (counts by status), and a job's parents and children as links."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..models import Dependency, Job, Workflow
from .display import JobPermissions, status_badge, thousands

# Links shown per list of parents or children; a fan-in of 500 parents shows these and a count.
SHOWN = 20
# A job's page reads at most this many of its edges each way: a wider fan-in or fan-out is
# said to be "over 1,000" (reading each of 300,000 parents took the page 2.6-5.4 s).
EDGES_READ = 1_000
# A job's edges counted as far as EDGES_READ + 1, in an index's order (axa_dependency_child:
# child_id, parent_id; axa_dependency_edge: parent_id, child_id): with a LIMIT alone, the
# plan read a fan-in holding much of the table by a sequential scan from the table's start.
COUNT_EDGES = {
    "parents": "SELECT count(*) FROM (SELECT 1 FROM axa_dependency WHERE child_id = %s ORDER BY parent_id LIMIT %s) d",
    "children": "SELECT count(*) FROM (SELECT 1 FROM axa_dependency WHERE parent_id = %s ORDER BY child_id LIMIT %s) d",
}


def count_edges(job: Job, side: str) -> int:
    """The job's parents or children (``side``), counted as far as EDGES_READ + 1."""
    with connections[job._state.db or Job.objects.db].cursor() as cursor:
        cursor.execute(COUNT_EDGES[side], [job.pk, EDGES_READ + 1])
        return int(cursor.fetchone()[0])


def said(edges: int, shown: int = 0) -> str:
    """``edges`` (counted as far as EDGES_READ + 1) less ``shown``: "992", or "over 992" past EDGES_READ."""
    return f"over {thousands(EDGES_READ - shown)}" if edges > EDGES_READ else thousands(edges - shown)


def _job_links(ids: list[Any], total: int, site: str) -> SafeString:
    if not ids:
        return mark_safe("-")
    found = dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))
    links = format_html_join(
        mark_safe("<br>"),
        '<a href="{}">{}</a> {}',
        (
            (reverse("admin:axa_django_job_change", args=[pk], current_app=site), str(pk), status_badge(found[pk]))
            if pk in found
            else ("#", f"{pk} (deleted)", "")
            for pk in ids
        ),
    )
    if total > len(ids):
        links = format_html("{}<br>and {} more", links, said(total, len(ids)))
    return links


class JobWorkflowFields:
    """Read-only fields of the job page: its group, parents and children (a mixin of JobAdmin)."""

    admin_site: admin.AdminSite
    workflow_fields = (
        "workflow_shown",
        "pending_parents",
        "on_parent_failure_shown",
        "parents_shown",
        "children_shown",
    )

    def workflow_fieldset(self, job: Job | None) -> list[tuple[str, dict[str, Any]]]:
        """The "Workflow" fieldset, for a job in a group or with dependencies."""
        if job is None or not (
            job.workflow_id or job.has_children or Dependency.objects.filter(child_id=job.pk).exists()
        ):
            return []
        return [("Workflow", {"fields": self.workflow_fields})]

    @admin.display(description="workflow")
    def workflow_shown(self, job: Job) -> SafeString | str:
        if not job.workflow_id:
            return "-"
        url = reverse("admin:axa_django_workflow_change", args=[job.workflow_id], current_app=self.admin_site.name)
        group = Workflow.objects.filter(pk=job.workflow_id).first()
        return format_html('<a href="{}">{}</a>', url, str(group) if group else job.workflow_id)

    @admin.display(description="if a parent fails")
    def on_parent_failure_shown(self, job: Job) -> str:
        return "run anyway" if job.on_parent_failure == "run" else "cancel"

    @admin.display(description="parents")
    def parents_shown(self, job: Job) -> SafeString:
        edges = Dependency.objects.filter(child_id=job.pk)
        ids = list(edges.order_by("parent_id").values_list("parent_id", flat=True)[:SHOWN])
        return _job_links(ids, count_edges(job, "parents") if len(ids) == SHOWN else len(ids), self.admin_site.name)

    @admin.display(description="children")
    def children_shown(self, job: Job) -> SafeString:
        edges = Dependency.objects.filter(parent_id=job.pk)
        # By child id, axa_dependency_edge's order: by the edges' id the plan walked the primary key (1 s at 1M edges).
        ids = list(edges.order_by("child_id").values_list("child_id", flat=True)[:SHOWN])
        return _job_links(ids, count_edges(job, "children") if len(ids) == SHOWN else len(ids), self.admin_site.name)


@admin.register(Workflow)
class WorkflowAdmin(JobPermissions, admin.ModelAdmin):  # type: ignore[type-arg]
    """Workflows and batches: each with its jobs counted by status, linked to the job list."""

    list_display = ("id_shown", "name", "kind", "created_at", "counts_line")
    list_display_links = ("id_shown", "name")
    list_filter = ("kind", "created_at")
    search_fields = ("name",)
    ordering = ("-created_at",)
    list_per_page = 50
    actions = ("cancel_selected",)
    fields = ("id", "kind", "name", "created_at", "counts_shown")
    readonly_fields = fields

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting the group would orphan its jobs' link; prune the jobs instead

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel")

    @admin.display(description="id", ordering="id")
    def id_shown(self, group: Workflow) -> str:
        return str(group.id)

    def _jobs_url(self, group: Workflow, **filters: str) -> str:
        url = reverse("admin:axa_django_job_changelist", current_app=self.admin_site.name)
        return f"{url}?{urlencode({'workflow_id__exact': str(group.id), **filters})}"

    @admin.display(description="jobs")
    def counts_line(self, group: Workflow) -> SafeString:
        counts = {status: n for status, n in group.counts().items() if n}
        if not counts:
            return mark_safe("-")
        return format_html_join(
            " ",
            '<a href="{}">{} {}</a>',
            ((self._jobs_url(group, status__exact=s), status_badge(s), thousands(n)) for s, n in counts.items()),
        )

    @admin.display(description="jobs by status")
    def counts_shown(self, group: Workflow) -> SafeString:
        counts = group.counts()
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td><a href="{}">{}</a></td></tr>',
            ((status_badge(s), self._jobs_url(group, status__exact=s), thousands(n)) for s, n in counts.items()),
        )
        total = sum(counts.values())
        return format_html(
            '<table>{}<tr><td>all</td><td><a href="{}">{}</a></td></tr></table>',
            rows,
            self._jobs_url(group),
            thousands(total),
        )

    @admin.action(description="Cancel the selected workflows' unfinished jobs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        changed = Job.objects.filter(workflow_id__in=ids).cancel()
        self.message_user(request, f"{changed} job(s) cancelled (running ones asked to stop).", messages.SUCCESS)
