"""A job's page: its timeline (enqueued, ready, each attempt and its worker, started, finished, the wait
and run times), its neighbourhood in its workflow as a small graph, and "Run now" for a scheduled job.

Everything is read by id (the job, its edges, its neighbours, the workers of its
attempts), never by a walk of the history: a page for one job costs the same at any size.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.contrib import messages
from django.db import connections, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..dependencies import FINISHED, PARENT_FAILED
from ..models import Dependency, Job, Worker, Workflow
from .actions import JobActions
from .display import STATUS_ICONS, format_duration, full_time, local_time, short_error, thousands
from .lists import refuse_nul
from .workflows import EDGES_READ, count_edges, said

logger = logging.getLogger("axa_django")

# Parents and children drawn around the job; a fan-in of 500 draws these and a count.
NEIGHBOURS = 8
# A node of the graph: its size, the gap between nodes, the distance between columns (SVG units).
NODE_W, NODE_H, GAP, COLUMN = 250, 42, 10, 320
SECOND = datetime.timedelta(seconds=1)
# A child's first EDGES_READ + 1 edges by parent id, in axa_dependency_child's order (as
# COUNT_EDGES), each parent probed: past that, its figures come from the child's own row
# (300,000 probes took 3.9 s). Each parent is found by its id: joined plainly, the plan
# merged the primary keys' range between the first and the last parent's id (for a fan-in
# enqueued over an hour, that hour's jobs); as an IN list, it read the queue whole. A time
# Python cannot hold (a foreign writer's 'infinity') is left out of the last finish. The
# graph draws the first NEIGHBOURS.
PARENTS = """
SELECT count(*), count(*) FILTER (WHERE p.status = ANY(%(ended)s)),
       max(p.finished_at) FILTER (WHERE p.finished_at BETWEEN '0001-01-02' AND '9999-12-30'),
       (array_agg(d.parent_id ORDER BY d.parent_id))[1:%(drawn)s]
FROM (SELECT parent_id FROM axa_dependency WHERE child_id = %(child)s ORDER BY parent_id LIMIT %(read)s) d
LEFT JOIN LATERAL (SELECT q.status, q.finished_at FROM axa_queue q WHERE q.id = d.parent_id LIMIT 1) p ON true
"""

# Scheduled rows brought forward, and the workers told of their run_at: it may lie behind
# the claims' floors (worker/lanes.py) when this waited on a lock, as a child's does (SETTLE).
RUN_NOW_NOTIFY = "SELECT pg_notify('axa_queue', 'ready:' || extract(epoch FROM now())::text)"


@dataclass(frozen=True)
class Event:
    """One line of the timeline: when (None: not recorded), what, and the worker or error behind it."""

    at: datetime.datetime | None
    what: str
    detail: str = ""
    status: str = ""  # a status whose colour marks the line ("" none)
    since: str = ""  # how long after the enqueue; set by _in_order
    order: datetime.datetime | None = None  # where it sorts, when not at ``at``

    @property
    def when(self) -> str:
        return full_time(self.at) if self.at is not None else "-"


@dataclass(frozen=True)
class Parents:
    """A child's parents as its page reads them: at most EDGES_READ + 1 edges, each parent probed."""

    edges: int  # edges read; EDGES_READ + 1: "over EDGES_READ", and the figures below are not read
    ended: int  # parents ended, of those read
    last: datetime.datetime | None  # the latest finish of those read
    drawn: list[uuid.UUID]  # the first NEIGHBOURS by id, for the graph

    @property
    def wide(self) -> bool:
        """Over EDGES_READ parents: counts come from the child's row, not from each parent."""
        return self.edges > EDGES_READ


@dataclass(frozen=True)
class Timeline:
    """What the job's page shows of its life."""

    events: list[Event]
    wait: str
    wait_label: str
    run: str
    run_label: str
    last_attempt_only: bool  # earlier attempts left only their end: the wait and run are the latest one's
    scheduled: bool  # queued with run_at in the future by the database clock: "Run now" applies


def database_now(using: str) -> datetime.datetime:
    """The database clock, aware: what is due, and for how long a job has waited, is the database's time.

    The statement's time, as Django's ``Now()`` (which ``run_now`` writes), not the transaction's.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return local_time(cursor.fetchone()[0])


def _parse_time(value: Any) -> datetime.datetime | None:
    """An attempt entry's ``at`` (ISO text, from a worker or the database), aware; None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=datetime.UTC)


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _aware(value: datetime.datetime | None) -> datetime.datetime | None:
    return local_time(value) if value is not None else None


def worker_labels(ids: set[uuid.UUID], using: str) -> dict[uuid.UUID, str]:
    """Each worker id as "host pid N (id)" while its axa_worker row is there, else the id alone."""
    labels = {pk: str(pk) for pk in ids}
    if ids:
        found = Worker.objects.using(using).filter(pk__in=ids).values_list("id", "hostname", "pid")
        labels.update({pk: f"{host} pid {pid} ({pk})" for pk, host, pid in found})
    return labels


def read_parents(job: Job, using: str) -> Parents:
    """PARENTS for ``job``: one probe by id per edge read."""
    with connections[using].cursor() as cursor:
        cursor.execute(PARENTS, {"child": job.pk, "ended": list(FINISHED), "read": EDGES_READ + 1, "drawn": NEIGHBOURS})
        edges, ended, last, drawn = cursor.fetchone()
    return Parents(edges, ended, last, drawn or [])


def build(job: Job, now: datetime.datetime, parents: Parents, using: str) -> Timeline:
    """The timeline of ``job`` at the database time ``now``, with its ``parents`` as read."""
    entries = [entry for entry in (job.errors or []) if isinstance(entry, dict)]
    workers = {w for w in (_uuid(e["worker"]) for e in entries if e.get("worker")) if w is not None}
    if job.worker_id:
        workers.add(job.worker_id)
    labels = worker_labels(workers, using)
    created, run_at = _aware(job.created_at), _aware(job.run_at)
    started, finished = _aware(job.started_at), _aware(job.finished_at)
    events = [Event(created, "Enqueued", f"queue {job.queue}, priority {job.priority}")]
    earlier = any(not _of_latest(job, entry, started) for entry in entries)  # attempts before the latest

    ready_at = run_at
    # Past EDGES_READ, the parents not yet counted as ended come from the child's row (SETTLE keeps
    # pending_parents), and the last finish, so when it became ready, is not read: that probes each.
    waiting = job.pending_parents if parents.wide else parents.edges - parents.ended
    if parents.edges and waiting > 0:
        ready_at = None
        if parents.wide:
            what, detail = f"Waiting for {thousands(waiting)} parents", f"of {said(parents.edges)}, as its row counts"
        else:
            what, detail = f"Waiting for {thousands(waiting)} of {thousands(parents.edges)} parents", ""
        events.append(Event(None, what, detail))
    elif parents.edges:
        last = None if parents.wide else _aware(parents.last)
        detail = f"the last of {said(parents.edges)} parent(s) ended"
        if (job.error or "").startswith(PARENT_FAILED):
            ready_at, detail = None, "a parent did not complete, so this job was cancelled"
        elif parents.wide:
            ready_at, detail = None, detail + " (when is not read: that would read every parent)"
        elif last is not None and run_at is not None:
            ready_at = max(last, run_at)  # queued in the transaction that ended its last parent
        events.append(Event(last, "Parents done", detail))
    scheduled = job.status == Job.Status.QUEUED and run_at is not None and run_at > now
    if scheduled:
        events.append(Event(run_at, "Scheduled to run", "not due yet"))
    elif ready_at is not None and (finished is None or ready_at <= finished):
        events.append(Event(ready_at, "Ready again" if earlier else "Became ready"))

    for entry in entries:
        at = _parse_time(entry.get("at"))
        # Cut to the second, the latest attempt's end may read as before its start, which it follows.
        order = started + SECOND / 1e6 if started and at and at < started and _of_latest(job, entry, started) else None
        if order is None and at is not None and created is not None and created - SECOND < at < created:
            order = created + SECOND / 1e6  # an attempt ended in the second it was enqueued in
        worker = _uuid(entry.get("worker")) if entry.get("worker") else None
        kind = str(entry.get("type") or "error").rpartition(".")[2]
        lines = str(entry.get("message") or "").strip().splitlines()
        detail = f"{kind}: {short_error(lines[0])}" if lines else kind
        where = f"on {labels.get(worker, str(worker))}" if worker else "no worker recorded"
        what = f"Attempt {entry.get('attempt', '?')} ended"
        events.append(Event(at, what, f"{detail} ({where})", "failed", order=order))

    on = f"on {labels[job.worker_id]}" if job.worker_id else "no worker recorded"
    if started is not None:
        events.append(Event(started, f"Started attempt {job.attempts}", on, "running"))
    elif job.status == Job.Status.RUNNING:
        what = f"Claimed for attempt {job.attempts}"
        events.append(Event(_aware(job.updated_at), what, f"{on}, not started yet", "running"))
    if finished is not None:
        label = Job.Status(job.status).label if job.status in Job.Status.values else job.status
        events.append(Event(finished, label, "", job.status if job.status in Job.Status.values else "other"))

    wait, wait_label = "-", "waited (ready to started)"
    if ready_at is not None and started is not None and started >= ready_at:
        wait = format_duration(started - ready_at)
    elif ready_at is not None and job.status == Job.Status.QUEUED and not scheduled:
        wait, wait_label = format_duration(max(now - ready_at, datetime.timedelta(0))), "waiting so far"
    run, run_label = "-", "ran (started to finished)"
    if started is not None and finished is not None:
        run = format_duration(finished - started)
    elif started is not None and job.status == Job.Status.RUNNING:
        run, run_label = format_duration(max(now - started, datetime.timedelta(0))), "running for"
    return Timeline(_in_order(events, created), wait, wait_label, run, run_label, earlier, scheduled)


def _of_latest(job: Job, entry: dict[str, Any], started: datetime.datetime | None) -> bool:
    """Whether ``entry`` is the end of the attempt that began at ``started`` (a worker writes it to the second, cut)."""
    at = _parse_time(entry.get("at"))
    if at is None or started is None:
        return False
    return entry.get("attempt") == job.attempts and at > started - SECOND


def _in_order(events: list[Event], created: datetime.datetime | None) -> list[Event]:
    """Events by time (one without a time stays after the event before it), each with its time since the enqueue."""
    keyed = []
    last = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    for index, event in enumerate(events):
        last = event.order or event.at or last
        keyed.append((last, index, event))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [
        replace(event, since="+" + format_duration(event.at - created))
        if event.at is not None and created is not None and event.at >= created
        else event
        for _, _, event in keyed
    ]


# The graph: the job in the middle, up to NEIGHBOURS parents left and children right.


def _node(x: int, y: int, pk: Any, found: dict[Any, tuple[str, str]], url: str | None) -> SafeString:
    name, status = found.get(pk, ("(deleted)", "other"))
    known = status if status in Job.Status.values else "other"
    label = Job.Status(status).label if status in Job.Status.values else status
    body = format_html(
        '<rect x="{}" y="{}" width="{}" height="{}" rx="6"/>'
        '<text x="{}" y="{}" class="axa-node-status">{} {}</text>'
        '<text x="{}" y="{}" class="axa-node-name">{}</text><title>{} ({}) {}</title>',
        x, y, NODE_W, NODE_H,
        x + 8, y + 16, STATUS_ICONS.get(status, "?"), label,
        x + 8, y + 33, short_error(name, 38),
        name, status, pk,
    )  # fmt: skip
    group = format_html('<g class="axa-node axa-node-{}" data-job="{}">{}</g>', known, pk, body)
    return format_html('<a href="{}">{}</a>', url, group) if url else group


def _more(x: int, y: int, count: str, what: str, url: str | None) -> SafeString:
    body = format_html(
        '<g class="axa-node axa-node-more"><rect x="{}" y="{}" width="{}" height="{}" rx="6"/>'
        '<text x="{}" y="{}">and {} more {}</text></g>',
        x, y, NODE_W, NODE_H, x + 8, y + 26, count, what,
    )  # fmt: skip
    return format_html('<a href="{}">{}</a>', url, body) if url else body


def _column(size: int, height: int) -> list[int]:
    """The y of each of ``size`` nodes, centred in ``height``."""
    top = (height - size * (NODE_H + GAP) + GAP) // 2
    return [top + i * (NODE_H + GAP) for i in range(size)]


def _children(job: Job, using: str) -> tuple[list[uuid.UUID], int]:
    """The first NEIGHBOURS children by id, in axa_dependency_edge's order (in the edges' id order, the plan
    walked the primary key: 1 s with 1,000,000 edges), and the edges counted as far as EDGES_READ + 1."""
    if not job.has_children:
        return [], 0
    down = Dependency.objects.using(using).filter(parent_id=job.pk)
    children = list(down.order_by("child_id").values_list("child_id", flat=True)[:NEIGHBOURS])
    return children, count_edges(job, "children") if len(children) == NEIGHBOURS else len(children)


def graph(job: Job, read: Parents, site: str, using: str) -> SafeString | None:
    """The job with its parents and children as linked nodes, each with its status; None without edges."""
    parents = read.drawn
    children, edges_down = _children(job, using)
    if not parents and not children:
        return None
    more_up, more_down = read.edges - len(parents), edges_down - len(children)
    found = {
        pk: (name, status)
        for pk, name, status in Job.objects.using(using)
        .filter(pk__in=[*parents, *children])
        .order_by()
        .values_list("id", "name", "status")
    }
    found[job.pk] = (job.name, job.status)
    group = (
        reverse("admin:axa_django_workflow_change", args=[job.workflow_id], current_app=site)
        if job.workflow_id
        else None
    )
    rows = max(len(parents) + bool(more_up), len(children) + bool(more_down), 1)
    height = rows * (NODE_H + GAP) + GAP
    # A side with no nodes takes no room: a first job of a workflow starts at the left.
    left = GAP
    middle = left + (COLUMN if parents else 0)
    right = middle + COLUMN
    width = (right if children else middle) + NODE_W + GAP
    (centre,) = _column(1, height)
    parts = [format_html('<g class="axa-current">{}</g>', _node(middle, centre, job.pk, found, None))]
    lines = []
    for x, ids, more, not_drawn, what, edge_x in (
        (left, parents, more_up, said(read.edges, len(parents)), "parents", (left + NODE_W, middle)),
        (right, children, more_down, said(edges_down, len(children)), "children", (middle + NODE_W, right)),
    ):
        for pk, y in zip(ids, _column(len(ids) + bool(more), height), strict=False):
            url = reverse("admin:axa_django_job_change", args=[pk], current_app=site) if pk in found else None
            parts.append(_node(x, y, pk, found, url))
            ends = (y + NODE_H // 2, centre + NODE_H // 2) if x == left else (centre + NODE_H // 2, y + NODE_H // 2)
            lines.append((edge_x[0], ends[0], edge_x[1], ends[1]))
        if more:
            y = _column(len(ids) + 1, height)[-1]
            parts.append(_more(x, y, not_drawn, what, group))
    edges = format_html_join(
        "", '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axa-edge" marker-end="url(#axa-arrow)"/>', lines
    )
    return format_html(
        '<svg class="axa-graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        'role="img" aria-label="{aria}"><defs><marker id="axa-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>{e}{n}</svg>',
        w=width,
        h=height,
        aria=f"This job with {said(read.edges)} parent(s) and {said(edges_down)} child(ren)",
        e=edges,
        n=format_html_join("", "{}", ((part,) for part in parts)),
    )


def run_now(jobs: QuerySet[Job]) -> int:
    """Move the scheduled jobs of ``jobs`` (queued, run_at in the future) to run now; return how many moved.

    A guarded UPDATE: a job claimed, cancelled or already due meanwhile is left as it is.
    Idle workers are woken at the commit.
    """
    with transaction.atomic(using=jobs.db):
        changed = jobs.filter(status=Job.Status.QUEUED, run_at__gt=Now()).update(run_at=Now(), updated_at=Now())
        if changed:
            with connections[jobs.db].cursor() as cursor:
                cursor.execute(RUN_NOW_NOTIFY)
    return changed


class JobTimeline(JobActions):
    """The job page's timeline and graph, and its "Run now" button (``axa_django.retry_job``)."""

    def timeline_urls(self) -> list[URLPattern]:
        """The run-now URL, to put before the admin's own."""
        if self.model is not Job:
            return []
        view = self.admin_site.admin_view(self.run_now_view)
        return [path("<path:object_id>/run-now/", view, name=f"{self.opts.app_label}_job_run_now")]

    def timeline_context(self, request: HttpRequest, job: Job) -> dict[str, Any]:
        """What the job page's timeline, graph and Run now button need."""
        using = job._state.db or Job.objects.db
        parents = read_parents(job, using)
        line = build(job, database_now(using), parents, using)
        site = self.admin_site.name
        group = Workflow.objects.using(using).filter(pk=job.workflow_id).first() if job.workflow_id else None
        return {
            "timeline": line,
            "graph": graph(job, parents, site, using),
            "group": group,
            "group_url": reverse("admin:axa_django_workflow_change", args=[group.pk], current_app=site)
            if group
            else "",
            # Moving a job forward is of a kind with queuing a failed one again to run now.
            "can_run_now": line.scheduled and self.has_retry_permission(request),
            "run_now_url": reverse("admin:axa_django_job_run_now", args=[job.pk], current_app=site),
        }

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Run one scheduled job now: a POST, with ``axa_django.retry_job``."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        refused = refuse_nul(request.GET, request.POST)
        if refused is not None:
            return refused
        job = self._post_target(request, object_id, self.has_retry_permission(request))
        due = full_time(job.run_at)
        if run_now(Job.objects.filter(pk=job.pk)):
            logger.info(
                "%s moved job %s (%s) to run now, 1 job changed (it was due %s)", request.user, job.pk, job.name, due
            )
            self.log_change(request, job, f"Run now: was scheduled for {due}.")
            self.message_user(request, f"Job {job.pk} runs now (it was scheduled for {due}).", messages.SUCCESS)
        else:
            job.refresh_from_db()
            why = "already due" if job.status == Job.Status.QUEUED else job.status
            self.message_user(request, f"Job {job.pk} was not moved: it is {why}, not scheduled.", messages.WARNING)
        return HttpResponseRedirect(
            reverse("admin:axa_django_job_change", args=[job.pk], current_app=self.admin_site.name)
        )
