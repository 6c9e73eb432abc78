"""The edges of "one id, one row" and "one bad row never stops the fleet", found by an adversarial review.

Each test here failed on the code as first written (or, where said, before it) and
passes now; the others disproved an idea and stay as regression tests.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.core import serializers
from django.db import DatabaseError, connection, transaction

from axa_django import sql
from axa_django.execution import Outcome, finish_in_place
from axa_django.models import Job
from axa_django.ops import fleetstats
from axa_django.worker import connect
from axa_django.worker.finisher import Finisher
from axa_django.worker.heartbeat import Heartbeat
from axa_django.worker.watchman import Watchman
from tests.conftest import AXA_APPS
from tests.refapp.models import Report
from tests.test_references import (
    constrained,  # noqa: F401 - a fixture
    lost_row,
    refused_entries,
    where,
)
from tests.test_seed_sql import REQUEUE_STALE
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(
    transaction=True, available_apps=[*AXA_APPS, "django.contrib.contenttypes", "tests.refapp"]
)


def seed(statement: str, *params: str) -> int:
    """Run one of the seed's statements with $n parameters, as sqlx does; rows changed."""
    conn = connect("default", "review seed")
    try:
        result = conn.pgconn.exec_params(statement.encode(), [p.encode() for p in params])
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, (result.error_message or b"").decode()
        return int(result.command_tuples or 0)
    finally:
        conn.close()


def register_worker(worker_id: uuid.UUID, beat_age: str = "0 seconds") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at) "
            "VALUES (%s, 'review', 1, 1, '[]', '[]', '[]', now() - %s::interval, now() - %s::interval)",
            [worker_id, beat_age, beat_age],
        )


def running_row(worker_id: uuid.UUID | None, *, started_ago: str = "0 seconds", **columns: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    names = ["id", "name", "args", "status", "worker_id", "started_at", "attempts", *columns]
    values = [job_id, "tests.testapp.jobs.add", json.dumps({"a": 1}), "running", worker_id]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO axa_queue ({', '.join(names)}) VALUES (%s, %s, %s, %s, %s, now() - %s::interval, 1"
            + ", %s" * len(columns)
            + ")",
            [*values, started_ago, *columns.values()],
        )
    return job_id


def finisher(worker_id: uuid.UUID) -> Finisher:
    """The worker's finisher, as far as ``write`` needs it (its database work is all real)."""
    f = Finisher.__new__(Finisher)
    f.worker_id = worker_id
    f.options = SimpleNamespace(using="default")
    f.control = SimpleNamespace(aborting=threading.Event())
    return f


def a_retry(job_id: uuid.UUID) -> Outcome:
    """The outcome of an attempt that raised with attempts left: the job is to be queued again."""
    entry = json.dumps({"attempt": 1, "at": "2026-01-01T00:00:00Z", "type": "ValueError", "message": "boom"})
    return Outcome(job_id, "tests.testapp.jobs.add", 1, "queued", error="ValueError: boom", entry=entry, delay=0.0)


# -- 1. the finisher: a retry outcome of a cancel-requested job whose move is refused -------------


def test_a_cancel_requested_retry_ends_cancelled_in_the_history_when_nothing_refuses() -> None:
    """FINISH's retried branch: a cancel-requested job that raised with attempts left ends cancelled (moved)."""
    worker_id = uuid.uuid4()
    job_id = running_row(worker_id, cancel_requested=True)
    conn = connect("default", "review finisher")
    try:
        _, unwritten = finisher(worker_id).write(conn, [a_retry(job_id)])
    finally:
        conn.close()
    assert unwritten == set()
    assert where(job_id) == [("axa_history", "cancelled")]


def test_finisher_leaves_a_cancel_requested_retry_running_for_ever_when_its_move_is_refused(
    constrained: Any,  # noqa: F811
) -> None:
    """A cancel-requested job that raised with attempts left, referenced by a constrained foreign key.

    FINISH ends it cancelled, which moves it: refused. ``Finisher._alone`` then tries the
    outcome stripped (still 'queued': refused again) and in place, but FINISH_IN_PLACE
    writes only outcomes that are not 'queued' (``v.status <> 'queued'``): it returns
    False, ``_alone`` returns the id as unwritten without trying its third attempt, and
    logs that the outcome "was written in place" although nothing was written. The row
    stays running under a live worker, uncancelled: on 96d179b nothing takes it back while
    that worker lives; since b7400e3 the worker's RECONCILE queues it again within a minute
    (cancel_requested kept, then cleared by the next claim) and the cancelled job runs again.
    """
    worker_id = uuid.uuid4()
    register_worker(worker_id)
    job_id = running_row(worker_id, cancel_requested=True)
    Report.objects.create(job_id=job_id)
    conn = connect("default", "review finisher")
    try:
        _, unwritten = finisher(worker_id).write(conn, [a_retry(job_id)])
    finally:
        conn.close()
    state = where(job_id)
    assert state == [("axa_queue", "cancelled")] and unwritten == set(), (
        f"the job was left {state} under its live worker; outcome unwritten: {unwritten}"
    )


# -- 2. the seed's REQUEUE_STALE guard -----------------------------------------------------------


def test_the_guard_spares_a_live_workers_job_from_the_seeds_requeue_stale() -> None:
    worker_id = uuid.uuid4()
    register_worker(worker_id)
    job_id = running_row(worker_id, started_ago="2 hours")
    assert seed(REQUEUE_STALE, "60") == 0
    assert where(job_id) == [("axa_queue", "running")]


def test_the_seeds_requeue_stale_never_requeues_a_dead_django_workers_job_while_its_row_remains() -> None:
    """The guard asks whether the worker is *registered*, not whether its heartbeat is fresh.

    A Django worker that died (SIGKILL, OOM, host lost) leaves its axa_worker row until a
    Django worker's RESCUE deletes it. In a mixed fleet with no Django worker left running
    (scaled to zero, a Rust-only deploy, all Django hosts down) nothing ever deletes it, and
    the Rust service's REQUEUE_STALE, its only recovery, now skips that job for ever. Before
    the guard it requeued it. The issue asked for "does not requeue a job whose Django
    worker's heartbeat is fresh": a heartbeat an hour old is not fresh.
    """
    worker_id = uuid.uuid4()
    register_worker(worker_id, beat_age="1 hour")
    job_id = running_row(worker_id, started_ago="2 hours")
    changed = seed(REQUEUE_STALE, "60")
    assert where(job_id) == [("axa_queue", "queued")], (
        f"REQUEUE_STALE changed {changed} row(s); the dead worker's job is left {where(job_id)}"
    )


@pytest.mark.parametrize("statement", ["RELEASE", "UNCLAIM", "FINISH retried", "RESCUE"])
def test_the_guard_never_skips_one_of_our_own_requeues(statement: str) -> None:
    """Every statement of ours that queues a running row again clears worker_id: the guard never holds."""
    worker_id = uuid.uuid4()
    register_worker(worker_id, beat_age="1 hour" if statement == "RESCUE" else "0 seconds")
    job_id = running_row(worker_id, started_ago="2 hours")
    conn = connect("default", "review")
    try:
        if statement == "RELEASE":
            conn.execute(sql.RELEASE, {"ids": [job_id], "worker": worker_id})
        elif statement == "UNCLAIM":
            conn.execute(sql.UNCLAIM, {"ids": [job_id], "worker": worker_id})
        elif statement == "FINISH retried":
            _, unwritten = finisher(worker_id).write(conn, [a_retry(job_id)])
            assert unwritten == set()
        else:
            conn.execute(sql.RESCUE, {"lease": 30, "stale": 60, "max_losses": 3})
    finally:
        conn.close()
    assert where(job_id) == [("axa_queue", "queued")]


# -- 3. axa.in_place: transaction-local, or longer? ------------------------------------------------


def test_in_place_on_the_workers_autocommit_connection_ends_with_its_transaction(constrained: Any) -> None:  # noqa: F811
    """finish_in_place's transaction is the connection's own: the next statement moves rows again."""
    worker_id = uuid.uuid4()
    held = running_row(worker_id)
    Report.objects.create(job_id=held)
    other = running_row(worker_id)
    conn = connect("default", "review")
    try:
        with conn.cursor() as cursor:
            outcome = Outcome(held, "tests.testapp.jobs.add", 1, "completed", result="1")
            assert finish_in_place(cursor, outcome, worker_id, "refused")
            cursor.execute("SELECT current_setting('axa.in_place', true)")
            assert cursor.fetchone()[0] in ("", None)
            cursor.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", [other])
    finally:
        conn.close()
    assert where(held) == [("axa_queue", "completed")]
    assert where(other) == [("axa_history", "completed")]


def test_a_refused_cancel_inside_a_callers_transaction_leaves_axa_in_place_on_for_the_rest_of_it(
    constrained: Any,  # noqa: F811
) -> None:
    """cancel() writes a refused row in place in a savepoint when the caller is inside atomic()
    (ATOMIC_REQUESTS, a view's transaction.atomic). ``set_config(..., true)`` is local to the
    *transaction*, not the savepoint: released, it stays on until the caller commits. Every
    row finished afterwards in that transaction (the next cancel, a status set by the ORM)
    silently stays in axa_queue, with no HistoryRefused note, uncounted by jobhealth.
    """
    held = jobs.add.perform_later(1)
    Report.objects.create(job=held)
    other = jobs.add.perform_later(2)
    with transaction.atomic():
        assert Job.objects.filter(pk=held.pk).cancel() == 1
        assert Job.objects.filter(pk=other.pk).cancel() == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('axa.in_place', true)")
            leaked = cursor.fetchone()[0]
    assert where(held.pk) == [("axa_queue", "cancelled")]
    assert where(other.pk) == [("axa_history", "cancelled")], (
        f"axa.in_place was {leaked!r} after the cancel's savepoint; the unrelated job was left {where(other.pk)}"
    )


def test_children_cancelled_by_a_parent_finished_in_place_stay_in_axa_queue_unnoted(constrained: Any) -> None:  # noqa: F811
    """finish_in_place settles the parent's children with axa.in_place still on: a child cancelled
    because its parent failed stays in axa_queue although nothing refuses its move, without the
    HistoryRefused entry that says why, and jobhealth does not count it."""
    parent = jobs.bad_result.perform_later()
    child = jobs.add.using(after=[parent]).perform_later(1)
    Report.objects.create(job=parent)
    from axa_django.worker import Worker

    assert Worker(burst=True, install_signals=False, concurrency=1).run() == 0
    assert where(parent.pk) == [("axa_queue", "failed")]
    assert where(child.pk) == [("axa_history", "cancelled")], (
        f"the child, whose move nothing refuses, was left {where(child.pk)} "
        f"with {len(refused_entries(Job.objects.get(pk=child.pk)))} HistoryRefused entries; "
        f"jobhealth counts {fleetstats.collect().history_refused}"
    )


# -- 4. save(): a Job saved by Django's own machinery -------------------------------------------


def test_loaddata_of_a_job_fixture_raises_jobgone_instead_of_inserting() -> None:
    """Django's deserializer (loaddata, a fixture, a dump moved between databases) saves with
    ``save_base(raw=True)``: an UPDATE first, then an INSERT when it touched nothing. ``_do_update``
    now raises JobGone where it returned 0, so a fixture holding a job can never be loaded."""
    job = jobs.add.perform_later(1)
    text = serializers.serialize("json", [Job.objects.get(pk=job.pk)])
    Job.objects.filter(pk=job.pk).delete()
    [obj] = serializers.deserialize("json", text)
    obj.save()
    assert where(job.pk) == [("axa_queue", "queued")]


def test_a_change_made_in_place_to_a_just_enqueued_jobs_args_is_saved_once_assigned() -> None:
    """The Job perform_later returns compares JSON by identity (no copy is made on the hot path,
    docs/jobs.md says so): a change made in place is written once the value is assigned."""
    job = jobs.add.perform_later(1)
    job.args = {**job.args, "b": 41}
    job.save()
    assert Job.objects.get(pk=job.pk).args == {"a": 1, "b": 41}


# -- 5. the rescue, row by row, under the heartbeat's deadline ------------------------------------

REFUSE_TRIGGER = """
CREATE FUNCTION review_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the user''s trigger refuses job %', OLD.id; END $$;
CREATE TRIGGER review_refuse BEFORE UPDATE ON axa_queue FOR EACH ROW
    WHEN (OLD.name = 'review.refused') EXECUTE FUNCTION review_refuse();
"""
NO_REFUSE_TRIGGER = "DROP TRIGGER IF EXISTS review_refuse ON axa_queue; DROP FUNCTION IF EXISTS review_refuse();"


@pytest.fixture
def refusing_trigger() -> Any:
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_TRIGGER)
    yield
    with connection.cursor() as cursor:
        cursor.execute(NO_REFUSE_TRIGGER)


def lost_rows(count: int, name: str, first: int) -> list[uuid.UUID]:
    """Rows running under a worker that is gone, with ids in a known order (``first`` upwards)."""
    ids = [uuid.UUID(int=first + i) for i in range(count)]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts) "
            "SELECT i, %s, '{}'::jsonb, 'running', gen_random_uuid(), now(), 1 FROM unnest(%s::uuid[]) AS i",
            [name, ids],
        )
    return ids


def rescue_rounds(rounds: int, budget: float, done: Callable[[], bool] | None = None) -> int:
    """The watchman's rescue as the heartbeat thread runs it: each round under its deadline ``until``,
    by one watchman (it remembers what was refused). With ``done``: rounds until it holds, at most
    ``rounds``; the rounds run."""
    watchman = Watchman(SimpleNamespace(lease=30.0, stale_minutes=60, housekeeping_interval=10.0))
    conn = connect("default", "review heartbeat")
    try:
        for ran in range(rounds):
            if done is not None and done():
                return ran
            watchman._sweep.next = 0.0  # each round is a beat a housekeeping interval after the last
            until = time.monotonic() + budget
            watchman.rescue(functools.partial(Heartbeat._run, None, conn, until))  # type: ignore[arg-type]
        return rounds
    finally:
        conn.close()


def test_rows_refused_even_in_place_starve_every_later_rescue_for_ever(refusing_trigger: Any) -> None:
    """Rows the database refuses as they are *and* in place (a user's trigger) stay running and
    are tried again first, in id order, at every round: two refused transactions each, under a
    deadline of 0.6 of a housekeeping interval. Once there are more of them than one round's
    budget covers, the rows after them (every other dead worker's job) are never reached:
    the rescue makes no progress, round after round. (Budget shrunk here from the default
    6 s to 0.2 s, with proportionally fewer refused rows, to keep the test short.)"""
    lost_rows(400, "review.refused", first=1)
    [good] = lost_rows(1, "tests.testapp.jobs.add", first=10**30)
    # Each refused row is tried (and logged) once, then passed over: the rounds get through,
    # in as many of them as the machine's speed needs (12 on a quiet one; before, none did).
    rounds = rescue_rounds(rounds=300, budget=0.2, done=lambda: where(good) == [("axa_queue", "queued")])
    assert where(good) == [("axa_queue", "queued")], f"after {rounds} rounds the good lost job is {where(good)}"


def test_the_row_by_row_rescue_writes_each_row_once_and_only_that_row(constrained: Any) -> None:  # noqa: F811
    """RESCUE_ONE / FAIL_NEVER_DUE_ONE (built by string replacement) and their in-place retries touch
    the one row named: the spent referenced row is failed in place with its note, every other lost
    row is queued again with one loss counted; the same for rows that can never be due."""
    spent = lost_row("tests.testapp.jobs.add", {"a": 1}, losses=2)
    Report.objects.create(job_id=spent)
    others = [lost_row("tests.testapp.jobs.add", {"a": i}) for i in range(5)]
    never = [jobs.add.perform_later(i) for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET run_at = 'infinity' WHERE id = ANY(%s)", [[j.pk for j in never]])
    Report.objects.create(job=never[0])
    rescue_rounds(rounds=1, budget=10.0)
    assert where(never[0].pk) == [("axa_queue", "failed")]
    assert len(refused_entries(Job.objects.get(pk=never[0].pk))) == 1
    for job in never[1:]:
        assert where(job.pk) == [("axa_history", "failed")]
        assert [e["type"] for e in Job.objects.get(pk=job.pk).errors] == ["NeverDue"]
    assert where(spent) == [("axa_queue", "failed")]
    assert len(refused_entries(Job.objects.get(pk=spent))) == 1
    for job_id in others:
        job = Job.objects.get(pk=job_id)
        assert (job.status, job.losses, len(job.errors), job.worker_id) == ("queued", 1, 1, None)


# -- 6. cancel as one statement, and the triggers UPDATE OF status ---------------------------------


def test_cancelling_a_running_job_sets_its_status_to_itself_and_no_trigger_misfires() -> None:
    """CANCEL sets status = status on running rows; every trigger UPDATE OF status on axa_queue is
    guarded by its WHEN: the row is not moved, the per-key counts stay exact, the flag is set once."""
    from tests.races import FLOW_MISMATCH

    worker_id = uuid.uuid4()
    register_worker(worker_id)
    job_id = running_row(worker_id, concurrency_key="k")
    assert Job.objects.filter(pk=job_id).cancel() == 1
    assert Job.objects.filter(pk=job_id).cancel() == 0  # already asked: not counted twice
    job = Job.objects.get(pk=job_id)
    assert (where(job_id), job.cancel_requested, job.finished_at) == ([("axa_queue", "running")], True, None)
    with connection.cursor() as cursor:
        cursor.execute(FLOW_MISMATCH)
        assert cursor.fetchall() == []


# -- 7. locking reads by id that cannot wait ------------------------------------------------------


def test_skip_locked_and_nowait_reads_by_id_do_not_loop_on_a_locked_row() -> None:
    job = jobs.add.perform_later(1)
    holder = connect("default", "review holder")
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM axa_queue WHERE id = %s FOR UPDATE", [job.pk])
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', '2s', true)")
            with pytest.raises(Job.DoesNotExist):
                Job.objects.select_for_update(skip_locked=True).get(pk=job.pk)
        with pytest.raises(Exception, match="could not obtain lock"), transaction.atomic():
            Job.objects.select_for_update(nowait=True).get(pk=job.pk)
        # A ROLLBACK, answered: a closed connection's backend releases its locks as it
        # exits, after close() returns (CI: the read below skipped the row still locked).
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    with transaction.atomic():
        assert Job.objects.select_for_update(skip_locked=True).get(pk=job.pk).pk == job.pk


# -- 8. a cancel asked of a running job, then its worker lost (pre-existing, beside FINISH's fix) ------


@pytest.mark.parametrize("statement", ["RESCUE", "RELEASE", "UNCLAIM", "RECONCILE"])
def test_a_cancel_requested_job_given_back_by_the_worker_runs_again(statement: str) -> None:
    """FINISH's retried branch now ends a cancel-requested job cancelled; the other statements that
    queue a running row again (the rescue of a dead worker, a hard shutdown's RELEASE, UNCLAIM of a
    row claimed ahead) keep queueing it, and the next claim clears cancel_requested and runs it:
    cancel() said 1 (changed), the job runs anyway. The commonest way in: an operator cancels a
    job that hangs, then kills its worker to stop it."""
    worker_id = uuid.uuid4()
    register_worker(worker_id, beat_age="1 hour" if statement == "RESCUE" else "0 seconds")
    job_id = running_row(worker_id)
    assert Job.objects.filter(pk=job_id).cancel() == 1
    conn = connect("default", "review")
    try:
        if statement == "RESCUE":
            conn.execute(sql.RESCUE, {"lease": 30, "stale": 60, "max_losses": 3})
        elif statement == "RECONCILE":
            if not hasattr(sql, "RECONCILE"):
                pytest.skip("RECONCILE arrived with b7400e3")
            conn.execute("UPDATE axa_queue SET updated_at = now() - interval '1 hour' WHERE id = %s", [job_id])
            conn.execute(sql.RECONCILE, {"worker": worker_id, "held": [], "grace": 2.0})
        else:
            conn.execute(getattr(sql, statement), {"ids": [job_id], "worker": worker_id})
    finally:
        conn.close()
    assert where(job_id)[0][1] == "cancelled", f"{statement} left the cancel-requested job {where(job_id)}"


# -- 9. Django 6.1's FETCH_PEERS loads deferred fields without refresh_from_db ------------------


def test_django61_fetch_peers_makes_save_write_back_a_stale_status_and_the_job_runs_again() -> None:
    """Django 6.1's FETCH_PEERS fills a deferred field on every peer with ``setattr`` (fetch_many),
    not through ``refresh_from_db``: the snapshot ``save()`` compares with never learns it, so the
    field counts as changed and ``save()`` writes back the value read then. Here a job read while
    queued finishes; saving its priority afterwards also writes status='queued', which the
    history's revive trigger moves back into axa_queue: the completed job runs again."""
    django = pytest.importorskip("django")
    if django.VERSION < (6, 1):
        pytest.skip("QuerySet.fetch_mode() arrived in Django 6.1")
    from django.db.models import FETCH_PEERS

    first, second = jobs.add.perform_later(1), jobs.add.perform_later(2)
    loaded = list(Job.objects.filter(pk__in=[first.pk, second.pk]).only("id", "priority").fetch_mode(FETCH_PEERS))
    assert {job.status for job in loaded} == {"queued"}  # one access loads status on both peers
    from axa_django.worker import Worker

    assert Worker(burst=True, install_signals=False, concurrency=1).run() == 0
    assert where(second.pk) == [("axa_history", "completed")]
    job = next(job for job in loaded if job.pk == second.pk)
    job.priority = 9
    job.save()
    assert where(second.pk) == [("axa_history", "completed")], (
        f"save() of priority alone left the finished job {where(second.pk)}: it will run again"
    )


# -- 10. Django's own ways of writing rows, refused by the new guards ----------------------------


def test_bulk_create_upsert_of_an_existing_job_is_refused() -> None:
    """``bulk_create(update_conflicts=True)`` is an upsert: a row whose id exists is meant to be
    updated. The new check refuses any id found anywhere, axa_queue included, before the statement
    (on 15e87c7 this updated the row)."""
    job = jobs.add.perform_later(1)
    Job.objects.bulk_create(
        [Job(id=job.pk, name=job.name, args={"a": 1}, priority=7)],
        update_conflicts=True,
        unique_fields=["id"],
        update_fields=["priority"],
    )
    assert Job.objects.get(pk=job.pk).priority == 7


def test_update_by_id_of_an_annotated_queryset_fails_on_its_new_row_lock() -> None:
    """update() by id now locks the rows first with the queryset's own query: an aggregate
    annotation makes it SELECT ... GROUP BY ... FOR UPDATE, which PostgreSQL refuses (on 15e87c7
    the update ran: Django drops the annotation from an UPDATE)."""
    from django.db.models import Count

    job = jobs.add.perform_later(1)
    assert Job.objects.annotate(n=Count("id")).filter(pk=job.pk).update(priority=3) == 1


def test_saving_a_live_workers_job_back_to_queued_says_the_guard_skipped_it() -> None:
    """The guard skips a user's own requeue of a running job whose worker is alive (worker_id
    kept, started_at cleared): save() says so, and does not claim the row is gone."""
    from axa_django.models.moves import JobGone

    worker_id = uuid.uuid4()
    register_worker(worker_id)
    job_id = running_row(worker_id)
    job = Job.objects.get(pk=job_id)
    job.status, job.started_at = "queued", None
    with pytest.raises(DatabaseError, match="axa_queue_requeue") as raised:
        job.save()
    assert not isinstance(raised.value, JobGone)
    assert where(job_id) == [("axa_queue", "running")]
