"""The job lists' filters, search and row fetching, and the guard against NUL characters in a query."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.db import OperationalError, connections, router, transaction
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Left, Right
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import registry
from ..ops import searchindex
from . import query
from .display import thousands

# The first characters of an id as the list shows them (dashes optional): 8 or more
# search the ids alone, fewer also search the text.
ID_PREFIX = re.compile(r"^[0-9a-f]{8,32}$")
SHORT_ID_PREFIX = re.compile(r"^[0-9a-f]{4,7}$")
# Jobs an id prefix lists at most, those with the greatest ids (the newest).
ID_MATCHES = 100
# A searched list's statements stop after this: a search no index answers reads every job.
SEARCH_SECONDS = 5
QUERY_CANCELED = "57014"
# Set on a request whose search was stopped: its list is shown again without it.
STOPPED = "axa_search_stopped"
NOTES = "axa_search_notes"


def refuse_nul(*queries: QueryDict) -> HttpResponseBadRequest | None:
    """A 400 if any key or value holds a NUL, which PostgreSQL text cannot hold (psycopg raises)."""
    for given in queries:
        for key, values in given.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                return HttpResponseBadRequest(
                    "A filter or search value holds a NUL character (%00); no job can match it.",
                    content_type="text/plain",
                )
    return None


def id_range(prefix: str) -> Q:
    """The ids starting with hex ``prefix``, as a range the primary key's index serves."""
    return Q(pk__gte=uuid.UUID(prefix.ljust(32, "0")), pk__lte=uuid.UUID(prefix.ljust(32, "f")))


def search_jobs(queryset: QuerySet[Any], term: str, time_field: str = "created_at") -> QuerySet[Any]:
    """Jobs matching ``term`` (query.py's syntax): its fields' filters, then its words as an id or text.

    Raise ``query.SearchError`` for a malformed term, before any SQL.
    """
    search = query.parse(term, time_field)
    return search_text(queryset.filter(search.filters), search.text)


def search_text(queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
    """Jobs matching ``term``: an id or id prefix by id alone, else text in the name, arguments or error."""
    term = term.strip()
    if not term:
        return queryset
    if by_id(term):
        try:
            return queryset.filter(pk=uuid.UUID(term))
        except ValueError:
            pass
        # Scanning args and error as text costs seconds on a large table; an id prefix means an id.
        # Ids begin with their time, so a prefix can match a whole batch or minute: the matches
        # are read by the primary key first, at most ID_MATCHES. Left to the list's ordering,
        # a plan walked the history's created index whole for a prefix with no match there
        # (0.5 s at 1,000,000 rows).
        prefix = term.lower().replace("-", "")
        ids = queryset.filter(id_range(prefix)).order_by("-pk").values_list("pk", flat=True)[:ID_MATCHES]
        return queryset.filter(pk__in=list(ids))
    text = Q(name__icontains=term) | Q(args__icontains=term) | Q(error__icontains=term)
    prefix = term.lower().replace("-", "")
    if SHORT_ID_PREFIX.match(prefix):
        text |= id_range(prefix)  # "cafe" may be text or an id's start
    return queryset.filter(text)


def by_id(term: str) -> bool:
    """Whether ``term`` is searched among the ids alone (a whole id, or 8+ of its first characters)."""
    try:
        uuid.UUID(term)
    except ValueError:
        return bool(ID_PREFIX.match(term.lower().replace("-", "")))
    return True


def search_notes(search: query.Search, using: str) -> list[str]:
    """A sentence for each form of ``search`` no index answers, which reads every job (the catalog, no rows)."""
    wanted = []
    if "args" in search.forms:
        wanted.append(("args.key:value", (searchindex.ARGS,), "add_args_index"))
    if "error" in search.forms:
        wanted.append(("error:", (searchindex.ERROR_TRIGRAM,), "add_trigram_indexes"))
    if "text" in search.forms and not by_id(search.text.strip()):
        wanted.append(("Text", searchindex.TRIGRAMS, "add_trigram_indexes"))
    notes = []
    with connections[using].cursor() as cursor:
        for form, indexes, function in wanted:
            lacking = searchindex.missing(cursor, *indexes)
            if lacking:
                notes.append(
                    f"{form} search reads every job: {', '.join(lacking)} "
                    f"{'has' if len(lacking) == 1 else 'have'} no index for it, and the page stops it after "
                    f"{SEARCH_SECONDS} s. A migration calling axa_django.ops.searchindex.{function} adds the index."
                )
    return notes


class Deadline:
    """An execute wrapper: each statement may take the time left of the page's bound, so the page's
    statements together (a count, then the rows) stop at the bound, not each at its own."""

    def __init__(self, seconds: float) -> None:
        self.ends = time.monotonic() + seconds

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        left = max(1, round((self.ends - time.monotonic()) * 1000))
        # On the driver's cursor: this statement is the bound's, not the page's (no wrapper, no debug log).
        context["cursor"].cursor.execute("SELECT set_config('statement_timeout', %s, true)", [f"{left}ms"])
        return execute(sql, params, many, context)


def within_search_time(using: str, render: Callable[[], HttpResponse]) -> HttpResponse | None:
    """``render()`` (a list page, rendered here) within SEARCH_SECONDS of statements; None if one was stopped."""
    connection = connections[using]
    try:
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('statement_timeout')")
            (before,) = cursor.fetchone()
            with connection.execute_wrapper(Deadline(SEARCH_SECONDS)):
                response = render()
                if isinstance(response, TemplateResponse):
                    response.render()  # the rows are read while rendering: inside the bound
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
    except OperationalError as error:
        if getattr(error.__cause__, "sqlstate", None) != QUERY_CANCELED:
            raise
        return None
    return response


class JobSearch(admin.ModelAdmin):
    """The job lists' search (a mixin of JobAdmin): query.py's syntax, bounded in time."""

    # What after: and before: bound: the time the list is sorted by, so that its index serves both.
    search_time_field = "created_at"
    search_time_label = "created"

    @property
    def search_help_text(self) -> str:  # type: ignore[override]
        return (
            "A job id or its start (8+ characters), text in the name, arguments or error, or fields: "
            'name:app.jobs.send_email queue:mail status:failed args.user_id:42 args.email:"a b" error:timeout '
            f"after:2026-12-01 before:2026-12-06T10:00 ({self.search_time_label})."
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # A malformed search, or one stopped for time, lists nothing (JobChangeList says why).
        if getattr(request, STOPPED, False):
            return queryset.none(), False
        try:
            return search_jobs(queryset, search_term, self.search_time_field), False
        except query.SearchError:
            return queryset.none(), False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "GET" and request.GET.get(SEARCH_VAR, "").strip():
            using = router.db_for_read(self.model)
            answered = within_search_time(using, lambda: super(JobSearch, self).changelist_view(request, extra_context))
            if answered is not None:
                return answered
            setattr(request, STOPPED, True)  # shown again without the search, saying it was stopped
        return super().changelist_view(request, extra_context)


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
    """Leaves the large columns out of list pages and fetches only each error's summary.

    Says what is wrong with a malformed search (``search_problem``, and lists nothing),
    which forms read every job (``search_notes``), and whether the search was stopped.
    """

    search_problem: str | None = None
    search_notes: list[str] = []
    search_stopped: bool = False

    @property
    def search_seconds(self) -> float:
        """How long a searched list may take before it is stopped."""
        return SEARCH_SECONDS

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        self.search_stopped = bool(getattr(request, STOPPED, False))
        if self.query:
            try:
                search = query.parse(self.query)
            except query.SearchError as problem:
                self.search_problem = str(problem)
            else:
                # Shown again with a stopped search, not read again: the catalog's functions lock
                # each table, and a lock held on one is a reason a search is stopped.
                if not self.search_stopped:
                    setattr(request, NOTES, search_notes(search, self.root_queryset.db))
                self.search_notes = getattr(request, NOTES, [])
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
