"""Deleting a workflow parent: its children are settled in the delete's transaction, on every delete path.

A parent deleted before it ended settles its children as a cancel would (their
``on_parent_failure``): before, they waited for ever, the workers' sweep settling only
parents that still exist. A parent deleted after it ended leaves them as its end settled
them. The paths: ``job.delete()``, a queryset's delete (by id, by filter, and Django's
fast delete), the admin's delete page and "delete selected" action, the bulk delete by
a list's filter; and a delete racing the parent's finish on a worker (tests/races.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from axa_django import Job, dependencies
from axa_django.execution import finish
from axa_django.models import Dependency
from axa_django.worker import connect
from tests.conftest import AXA_APPS
from tests.races import Actor, Move, Subject, check_invariants, claim, completed, register, run_into, view, where
from tests.test_admin import JOBS
from tests.test_admin_bulk import confirm, run, start_url
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db

# The parent is the only job of its name: a filter by name takes it alone.
PARENT = wj.step


def family(parent: Job) -> dict[str, Job]:
    """Children of ``parent`` of each kind: one cancelled with it (and its own child through it), one that
    runs anyway, one that runs anyway but waits for another parent too."""
    cancels = wj.noop.using(after=[parent]).perform_later(1)
    other = wj.noop.perform_later(2)
    return {
        "cancels": cancels,
        "below": wj.noop.using(after=[cancels]).perform_later(3),
        "runs": wj.noop.using(after=[parent], on_parent_failure="run").perform_later(4),
        "waits": wj.noop.using(after=[parent, other], on_parent_failure="run").perform_later(5),
        "other": other,
    }


def states(jobs: dict[str, Job]) -> dict[str, tuple[str, int]]:
    found = dict(Job.objects.filter(pk__in=[j.pk for j in jobs.values()]).values_list("id", "status"))
    pending = dict(Job.objects.filter(pk__in=[j.pk for j in jobs.values()]).values_list("id", "pending_parents"))
    return {key: (found[job.pk], pending[job.pk]) for key, job in jobs.items()}


def error(job: Job) -> str | None:
    return Job.objects.get(pk=job.pk).error


# After a parent deleted before it ended: as a cancel leaves them.
AS_CANCELLED = {
    "cancels": ("cancelled", 0),
    "below": ("cancelled", 0),
    "runs": ("queued", 0),
    "waits": ("waiting", 1),
    "other": ("queued", 0),
}


def assert_settled_as_cancelled(parent_id: uuid.UUID, kids: dict[str, Job]) -> None:
    assert not Job.objects.filter(pk=parent_id).exists()
    assert states(kids) == AS_CANCELLED
    assert error(kids["cancels"]) == (
        f"ParentFailed: parent job {parent_id} was deleted before it ended, so this job was cancelled"
    )
    assert error(kids["below"]) == (
        f"ParentFailed: parent job {kids['cancels'].pk} ended cancelled, so this job was cancelled"
    )
    assert not Dependency.objects.filter(parent_id=parent_id, done=False).exists()


def _admin_delete_page(client: Client, job: Job) -> None:
    response = client.post(reverse("admin:axa_django_job_delete", args=[job.pk]), {"post": "yes"})
    assert response.status_code == 302, response.content[:500]


def _admin_delete_selected(client: Client, job: Job) -> None:
    data = {"action": "delete_selected", "_selected_action": [str(job.pk)], "post": "yes"}
    response = client.post(JOBS, data)
    assert response.status_code == 302, response.content[:500]


def _bulk_delete(client: Client, job: Job) -> None:
    op = run(confirm(client, start_url("job", "delete", f"name={PARENT.name}")))
    assert (op.status, op.changed) == ("done", 1), (op.status, op.changed)


def _fast_delete(client: Client, job: Job) -> None:
    # Django's one-statement delete, which it takes when nothing points at Job (tests.refapp
    # does here, so .delete() reads the rows first): called as its Collector calls it.
    with transaction.atomic():
        assert Job.objects.filter(name=PARENT.name)._raw_delete("default") == 1


DELETES: dict[str, Callable[[Client, Job], Any]] = {
    "job.delete": lambda client, job: job.delete(),
    "by id": lambda client, job: Job.objects.filter(pk=job.pk).delete(),
    "by filter": lambda client, job: Job.objects.filter(name=PARENT.name).delete(),
    "fast delete": _fast_delete,
    "admin delete page": _admin_delete_page,
    "admin delete selected": _admin_delete_selected,
    "bulk delete": _bulk_delete,
}


@pytest.mark.parametrize("how", list(DELETES))
def test_deleting_a_queued_parent_settles_its_children_as_a_cancel_would(admin_client: Client, how: str) -> None:
    parent = PARENT.perform_later("p", "unused")
    kids = family(parent)
    assert states(kids)["cancels"] == ("waiting", 1)
    DELETES[how](admin_client, Job.objects.get(pk=parent.pk))
    assert_settled_as_cancelled(parent.pk, kids)


def _waiting(parent: Job) -> None:
    assert parent.status == "waiting"  # it has a parent of its own, still queued


def _running(parent: Job) -> None:
    # As a worker's claim leaves it.
    Job.objects.filter(pk=parent.pk).update(status="running", worker_id=uuid.uuid4(), started_at=timezone.now())


@pytest.mark.parametrize("state", ["waiting", "running"])
def test_deleting_a_waiting_or_running_parent_settles_its_children_too(state: str) -> None:
    above = wj.noop.perform_later(0)
    parent = (PARENT.using(after=[above]) if state == "waiting" else PARENT).perform_later("p", "unused")
    (_waiting if state == "waiting" else _running)(parent)
    kids = family(parent)
    loaded = Job.objects.get(pk=parent.pk)
    assert loaded.status == state
    assert loaded.delete()[0] == 1
    assert_settled_as_cancelled(parent.pk, kids)
    assert Job.objects.get(pk=above.pk).status == "queued"


def test_deleting_a_finished_parent_leaves_its_children_as_its_end_settled_them() -> None:
    """Counted at its end (a worker's finish): unchanged. Ended by the seed's FINISH, not yet counted by a
    worker's sweep (which reads only parents that still exist): settled as it ended."""
    counted = PARENT.perform_later("counted", "unused")
    counted_kids = family(counted)
    uncounted = PARENT.perform_later("uncounted", "unused")
    uncounted_kids = family(uncounted)
    Job.objects.filter(pk__in=[counted.pk, uncounted.pk]).update(status="completed", finished_at=timezone.now())
    with connection.cursor() as cursor:
        dependencies.settle(cursor, [counted.pk])
    after_end = {
        "cancels": ("queued", 0),
        "below": ("waiting", 1),
        "runs": ("queued", 0),
        "waits": ("waiting", 1),
        "other": ("queued", 0),
    }
    assert states(counted_kids) == after_end
    assert states(uncounted_kids)["cancels"] == ("waiting", 1)
    assert Job.objects.filter(name=PARENT.name).delete()[0] == 2
    assert states(counted_kids) == after_end
    assert states(uncounted_kids) == after_end
    assert error(uncounted_kids["cancels"]) is None


def test_a_delete_of_parents_with_their_children_strands_nothing() -> None:
    """A whole workflow deleted at once (parent and some children): the children left behind are settled."""
    parent = PARENT.perform_later("p", "unused")
    kids = family(parent)
    gone = [parent.pk, kids["cancels"].pk, kids["runs"].pk]
    assert Job.objects.filter(pk__in=gone).delete()[0] == 3
    assert states({key: kids[key] for key in ("below", "waits", "other")}) == {
        "below": ("cancelled", 0),
        "waits": ("waiting", 1),
        "other": ("queued", 0),
    }
    assert error(kids["below"]) == (
        f"ParentFailed: parent job {kids['cancels'].pk} was deleted before it ended, so this job was cancelled"
    )


# A delete racing the parent's finish on a worker: stepped on two connections.


@pytest.fixture(scope="module")
def actors() -> Iterator[tuple[Actor, Actor]]:
    made = (Actor("A"), Actor("B"))
    yield made
    for actor in made:
        actor.close()


@pytest.fixture
def setup_conn() -> Iterator[psycopg.Connection[Any]]:
    with connect("default", "race setup") as conn:
        yield conn


def _running_parent(conn: psycopg.Connection[Any]) -> tuple[Subject, dict[str, Job]]:
    """A parent claimed by a live worker (its children waiting), as a worker's claim leaves it."""
    worker = uuid.uuid4()
    register(conn, worker, [PARENT.name])
    parent = PARENT.perform_later("p", "unused")
    kids = {
        "cancels": wj.noop.using(after=[parent]).perform_later(1),
        "runs": wj.noop.using(after=[parent], on_parent_failure="run").perform_later(2),
    }
    [claimed] = claim(conn, [PARENT.name], worker)
    assert claimed.id == parent.pk
    s = Subject(parent.pk, PARENT.name, worker=worker, claimed=claimed, function=PARENT)
    s.loaded = {"A": Job.objects.get(pk=parent.pk), "B": Job.objects.get(pk=parent.pk)}
    return s, kids


def _finish(actor: Actor, s: Subject) -> int:
    """The worker's finish of the parent's attempt (it completed): 1 if written, 0 if its row was gone."""
    assert s.claimed is not None
    with actor.worker_conn.cursor() as cursor:
        return int(s.id not in finish(cursor, [completed(s.claimed)], s.worker))


RACE_DELETES = {
    "job.delete": Move("job.delete", lambda a, s: s.loaded[a.name].delete()[0]),
    "delete_selected": Move("delete_selected", lambda a, s: Job.objects.filter(pk__in=[s.id]).delete()[0]),
}
FINISH = Move("FINISH ok", _finish, "worker")

# first, commit: what the second statement returned, the parent's row, the children (cancels, runs).
# fmt: off
RACES = {
    ("delete", True):  (0, "gone",              "cancelled", "queued"),
    ("delete", False): (1, "completed@history", "queued",    "queued"),
    ("finish", True):  (1, "gone",              "queued",    "queued"),
    ("finish", False): (1, "gone",              "cancelled", "queued"),
}
# fmt: on


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("first", ["delete", "finish"])
@pytest.mark.parametrize("how", list(RACE_DELETES))
def test_a_delete_meeting_the_parents_finish_strands_no_child_and_resurrects_nothing(
    actors: tuple[Actor, Actor], setup_conn: psycopg.Connection[Any], how: str, first: str
) -> None:
    """A holds the parent's row (the delete, or the worker's finish), B waits on it; A commits, then (a
    fresh family) rolls back. Whichever ends first, the finish never fails nor brings the row back, and
    every child ends as the parent's fate says."""
    holder, other = actors
    a, b = (RACE_DELETES[how], FINISH) if first == "delete" else (FINISH, RACE_DELETES[how])
    for commit in (True, False):
        holder.ready()
        other.ready()
        s, kids = _running_parent(setup_conn)
        holder.begin()
        holder.call(a.run, holder, s)
        [ran] = run_into(holder, [(other, b)], s, True, commit)
        row = view(s.id)
        found = (ran.get(), where(row), *(Job.objects.get(pk=kid.pk).status for kid in kids.values()))
        assert found == RACES[first, commit], (first, commit)
        check_invariants([kid.pk for kid in kids.values()], [s.id] if row is None else [])
        assert not Dependency.objects.filter(parent_id=s.id, done=False).exists()
