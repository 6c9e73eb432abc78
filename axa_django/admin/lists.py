"""The job lists' filters, search and row fetching, and the guard against NUL characters in a query."""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left, Right
from django.http import HttpRequest, HttpResponseBadRequest, QueryDict
from django.urls import reverse

from .. import registry
from .display import thousands

# The first characters of an id as the list shows them (dashes optional): 8 or more
# search the ids alone, fewer also search the text.
ID_PREFIX = re.compile(r"^[0-9a-f]{8,32}$")
SHORT_ID_PREFIX = re.compile(r"^[0-9a-f]{4,7}$")
# Jobs an id prefix lists at most, those with the greatest ids (the newest).
ID_MATCHES = 100


def refuse_nul(*queries: QueryDict) -> HttpResponseBadRequest | None:
    """A 400 if any key or value holds a NUL, which PostgreSQL text cannot hold (psycopg raises)."""
    for query in queries:
        for key, values in query.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return HttpResponseBadRequest(
                    "A filter or search value holds a NUL character (%00); no job can match it.",
                    content_type="text/plain",
                )
    return None


def id_range(prefix: str) -> Q:
    """The ids starting with hex ``prefix``, as a range the primary key's index serves."""
    return Q(pk__gte=uuid.UUID(prefix.ljust(32, "0")), pk__lte=uuid.UUID(prefix.ljust(32, "f")))


def search_jobs(queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
    """Jobs matching ``term``: an id or id prefix by id alone, else text in the name, arguments or error."""
    term = term.strip()
    if not term:
        return queryset
    try:
        return queryset.filter(pk=uuid.UUID(term))
    except ValueError:
        pass
    prefix = term.lower().replace("-", "")
    if ID_PREFIX.match(prefix):
        # Scanning args and error as text costs seconds on a large table; an id prefix means an id.
        # Ids begin with their time, so a prefix can match a whole batch or minute: the matches
        # are read by the primary key first, at most ID_MATCHES. Left to the list's ordering,
        # a plan walked the history's created index whole for a prefix with no match there
        # (0.5 s at 1,000,000 rows).
        ids = queryset.filter(id_range(prefix)).order_by("-pk").values_list("pk", flat=True)[:ID_MATCHES]
        return queryset.filter(pk__in=list(ids))
    text = Q(name__icontains=term) | Q(args__icontains=term) | Q(error__icontains=term)
    if SHORT_ID_PREFIX.match(prefix):
        text |= id_range(prefix)  # "cafe" may be text or an id's start
    return queryset.filter(text)


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

    @property
    def estimated(self) -> bool:
        """Whether ``result_count`` is the planner's estimate (see pagination.py)."""
        return bool(getattr(self.paginator, "estimated", False))

    @property
    def result_count_shown(self) -> str:
        """The count as the search bar and the paginator both say it: "about 300,000" when estimated."""
        return ("about " if self.estimated else "") + thousands(self.result_count)


class FailedJobChangeList(JobChangeList):
    """The failed jobs: each row opens the job's own page, not the failed list's URL that redirects there."""

    def url_for_result(self, result: Any) -> str:
        return reverse(
            "admin:axa_django_job_change", args=(quote(result.pk),), current_app=self.model_admin.admin_site.name
        )
