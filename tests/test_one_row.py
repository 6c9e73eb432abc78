"""A job is one row wherever it lives: save() writes only what the caller changed, never inserts a taken id."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from axa_django.models import Job
from axa_django.models.moves import JobGone
from axa_django.worker import Worker
from tests.conftest import AXA_APPS
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def burst() -> None:
    assert Worker(burst=True, install_signals=False, concurrency=2).run() == 0


def rows(job_id: uuid.UUID) -> list[tuple[str, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text, status, priority FROM axa_queue WHERE id = %s", [job_id])
        return cursor.fetchall()


def updates(context: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in context.captured_queries if q["sql"].startswith("UPDATE")]


def test_save_writes_only_the_fields_the_caller_changed() -> None:
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    job.priority = 7
    with CaptureQueriesContext(connection) as seen:
        job.save()
    [update] = updates(seen)
    assert update.startswith('UPDATE "axa_queue" SET "priority" = 7 WHERE')
    assert rows(job.pk) == [("axa_queue", "queued", 7)]


def test_save_with_nothing_changed_writes_nothing() -> None:
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    with CaptureQueriesContext(connection) as seen:
        job.save()
    assert seen.captured_queries == []


def test_a_stale_instance_never_writes_back_the_status_it_read() -> None:
    # Loaded while queued; the worker completes (and moves) the row; the caller changes
    # one field: the row stays completed, in the history, with that field changed.
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    burst()
    job.priority = 3
    job.save()
    assert rows(job.pk) == [("axa_history", "completed", 3)]
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_an_instance_from_perform_later_saves_only_what_changed() -> None:
    job = jobs.add.perform_later(1)
    burst()
    job.priority = 4
    job.save()
    assert rows(job.pk) == [("axa_history", "completed", 4)]


def test_a_json_value_changed_in_place_is_written() -> None:
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    job.args["b"] = 5
    with CaptureQueriesContext(connection) as seen:
        job.save()
    [update] = updates(seen)
    assert '"args"' in update and '"status"' not in update
    assert Job.objects.get(pk=job.pk).args == {"a": 1, "b": 5}


def test_refresh_from_db_takes_the_fresh_values_as_loaded() -> None:
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    burst()
    job.refresh_from_db()
    assert job.status == "completed"
    with CaptureQueriesContext(connection) as seen:
        job.save()
    assert seen.captured_queries == []


def test_save_of_a_deleted_job_raises_and_inserts_nothing() -> None:
    job = Job.objects.get(pk=jobs.add.perform_later(1).pk)
    Job.objects.filter(pk=job.pk).delete()
    job.priority = 2
    with pytest.raises(JobGone, match=f"job {job.pk} was not saved: its row no longer exists"):
        job.save()
    assert rows(job.pk) == []


def test_an_id_in_the_history_is_never_inserted_again() -> None:
    done = jobs.add.perform_later(1)
    burst()
    with pytest.raises(IntegrityError, match="exists already"):
        Job.objects.create(id=done.pk, name="x")
    with pytest.raises(IntegrityError, match="exists already"):
        Job(id=done.pk, name="x").save()
    with pytest.raises(IntegrityError, match="exists already"):
        Job.objects.bulk_create([Job(name="y"), Job(id=done.pk, name="x")])
    fresh = Job(name="z")
    assert len(Job.objects.bulk_create([fresh, Job(id=done.pk, name="x")], ignore_conflicts=True)) == 1
    assert rows(done.pk) == [("axa_history", "completed", 0)]
    assert rows(fresh.pk) == [("axa_queue", "queued", 0)]


def test_a_job_loaded_by_the_orm_and_saved_after_a_retry_stays_one_row() -> None:
    failed = jobs.bad_result.perform_later()
    burst()
    job = Job.objects.get(pk=failed.pk)
    assert job.status == "failed"
    assert Job.objects.filter(pk=job.pk).retry() == 1  # moved back to axa_queue
    job.priority = 9
    job.save()
    assert rows(job.pk) == [("axa_queue", "queued", 9)]


def test_update_and_delete_by_id_reach_a_row_in_the_history() -> None:
    done = jobs.add.perform_later(1)
    burst()
    assert Job.objects.filter(pk=done.pk).update(priority=5) == 1
    assert rows(done.pk) == [("axa_history", "completed", 5)]
    assert Job.objects.filter(pk=done.pk).delete()[0] == 1
    assert rows(done.pk) == []


def test_a_row_whose_json_is_nested_deeper_than_a_copy_can_follow_still_loads_and_saves() -> None:
    # 600 levels: json decodes it, a deep copy of it would raise RecursionError (the admin's list then failed).
    job = jobs.add.perform_later(1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET args = %s::jsonb WHERE id = %s", ["[" * 600 + "]" * 600, job.pk])
    loaded = Job.objects.get(pk=job.pk)
    assert isinstance(loaded.args, list)
    loaded.priority = 6
    loaded.save()
    assert rows(job.pk) == [("axa_queue", "queued", 6)]
