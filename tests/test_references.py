"""A user's reference to a job: through every move of its row, and one row the history refuses stops nothing.

The documented pattern (``ForeignKey("axa_django.Job", db_constraint=False)``) works through
the finish, a retry and retention; a relation with a database constraint is refused by
the system check (E008); and where one exists anyway (made by SQL, or the check
silenced), the finisher, the rescue, pruning, cancel and retry isolate the row it
refuses, finish it in place and count it, and every other job goes on.
"""

from __future__ import annotations

import datetime
import json
import signal
import uuid
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection, models, transaction
from django.test.utils import isolate_apps

from axa_django import history, pruning
from axa_django.models import FailedJob, Job
from axa_django.models.moves import check_references, reference_problems
from axa_django.ops import fleetstats
from axa_django.sql import refused
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for
from tests.refapp.models import Note, Report
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(
    transaction=True, available_apps=[*AXA_APPS, "django.contrib.contenttypes", "tests.refapp"]
)

ZERO = datetime.timedelta(0)

# What Django itself creates for a ForeignKey to Job (db_constraint=True): deferred to the commit.
CONSTRAINT = (
    "ALTER TABLE refapp_report ADD CONSTRAINT refapp_report_job_fk FOREIGN KEY (job_id) "
    "REFERENCES axa_queue (id) DEFERRABLE INITIALLY DEFERRED"
)


@pytest.fixture
def constrained() -> Any:
    """The report's foreign key, with the database constraint E008 refuses (added by SQL, as a user might)."""
    with connection.cursor() as cursor:
        cursor.execute(CONSTRAINT)
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE refapp_report DROP CONSTRAINT IF EXISTS refapp_report_job_fk")


def burst(**options: Any) -> Worker:
    options.setdefault("concurrency", 2)
    worker = Worker(burst=True, install_signals=False, **options)
    assert worker.run() == 0
    return worker


def where(job_id: uuid.UUID) -> list[tuple[str, str]]:
    """The tables holding this id, with the status each has."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text, status FROM axa_queue WHERE id = %s", [job_id])
        return cursor.fetchall()


def refused_entries(job: Job) -> list[dict[str, Any]]:
    job.refresh_from_db()
    return [entry for entry in job.errors if entry.get("type") == refused.REFUSED_TYPE]


# -- the system check ---------------------------------------------------------------------


@isolate_apps("tests.refapp")
def test_a_constrained_relation_to_job_is_refused_by_e008_with_the_fix() -> None:
    class Export(models.Model):
        job = models.ForeignKey(Job, null=True, on_delete=models.SET_NULL)
        one = models.OneToOneField(FailedJob, null=True, on_delete=models.CASCADE, related_name="+")
        many = models.ManyToManyField(Job, related_name="+")
        fine = models.ForeignKey(Job, null=True, on_delete=models.SET_NULL, db_constraint=False, related_name="+")
        many_fine = models.ManyToManyField(Job, related_name="+", db_constraint=False)

        class Meta:
            app_label = "refapp"

    found = reference_problems([Export])
    assert [(p.id, p.obj.name) for p in found] == [
        ("axa_django.E008", "job"),
        ("axa_django.E008", "one"),
        ("axa_django.E008", "many"),
    ]
    assert "db_constraint=False" in found[0].hint and "moves into the history" in found[0].msg


def test_the_projects_own_models_pass_the_check() -> None:
    assert check_references() == []  # Report declares db_constraint=False


# -- the documented pattern ------------------------------------------------------------------


def test_a_reference_follows_its_job_through_the_finish_and_a_retry() -> None:
    job = jobs.add.perform_later(1, b=2)
    failing = jobs.bad_result.perform_later()
    report = Report.objects.create(title="r", job=job)
    other = Report.objects.create(title="f", job_id=failing.pk)
    note = Note.objects.create(content_type=ContentType.objects.get_for_model(Job), object_id=str(job.pk))
    burst()
    assert where(job.pk) == [("axa_history", "completed")]
    assert Report.objects.get(pk=report.pk).job == Job.objects.get(pk=job.pk)
    assert Report.objects.select_related("job").get(pk=report.pk).job.status == "completed"
    [prefetched] = Report.objects.filter(pk=report.pk).prefetch_related("job")
    assert prefetched.job.pk == job.pk
    assert [r.pk for r in Job.objects.prefetch_related("reports").get(pk=job.pk).reports.all()] == [report.pk]
    assert Job.objects.filter(reports__title="r").get().pk == job.pk
    assert Note.objects.get(pk=note.pk).target.pk == job.pk
    # The failed job goes back to axa_queue on a retry, and the reference still finds it.
    assert Job.objects.get(pk=failing.pk).status == "failed"
    assert Job.objects.filter(pk=failing.pk).retry() == 1
    assert where(failing.pk) == [("axa_queue", "queued")]
    assert Report.objects.get(pk=other.pk).job.status == "queued"


def test_deleting_a_referenced_job_applies_on_delete_wherever_its_row_is() -> None:
    job = jobs.add.perform_later(1)
    report = Report.objects.create(job=job)
    burst()
    Job.objects.get(pk=job.pk).delete()  # from the history
    assert Report.objects.get(pk=report.pk).job_id is None
    assert where(job.pk) == []


def test_a_reference_outlives_a_job_dropped_by_retention_as_documented() -> None:
    job = jobs.add.perform_later(1)
    report = Report.objects.create(job=job)
    burst()
    # As housekeeping runs them: each step a transaction of its own (a table made by an
    # earlier test may already wait as the next one: prepare then makes none).
    with transaction.atomic(), connection.cursor() as cursor:
        history.prepare(cursor)
    with transaction.atomic(), connection.cursor() as cursor:
        assert history.close(cursor, ZERO) is not None
    with connection.cursor() as cursor:
        while history.drop(cursor, ZERO) is not None:
            pass
    assert where(job.pk) == []
    report = Report.objects.get(pk=report.pk)
    assert report.job_id == job.pk  # the id stays; the job does not
    with pytest.raises(Job.DoesNotExist):
        report.job  # noqa: B018


# -- a constrained reference, isolated ---------------------------------------------------------


def test_the_finisher_finishes_a_refused_row_in_place_and_every_other_job_runs(constrained: Any) -> None:
    before = [jobs.add.perform_later(i) for i in range(20)]
    held = jobs.add.perform_later(100)
    failing = jobs.bad_result.perform_later()
    after = [jobs.add.perform_later(i) for i in range(20)]
    Report.objects.create(job=held)
    Report.objects.create(job=failing)
    worker = burst(concurrency=4)
    assert worker.processed == 42
    for job in [*before, *after]:
        assert where(job.pk) == [("axa_history", "completed")]
    # The referenced jobs ran once and ended as they should, in axa_queue, saying why.
    assert where(held.pk) == [("axa_queue", "completed")]
    assert where(failing.pk) == [("axa_queue", "failed")]
    assert Job.objects.get(pk=held.pk).result == 100
    [entry] = refused_entries(held)
    assert "ForeignKeyViolation" in entry["message"] and "db_constraint=False" in entry["message"]
    assert len(refused_entries(failing)) == 1
    assert fleetstats.collect().history_refused == 2


def test_a_runworker_lives_through_a_refused_row_and_says_so(constrained: Any, workers: Any) -> None:
    held = jobs.add.perform_later(1)
    Report.objects.create(job=held)
    proc = workers.start("--concurrency", "2")
    wait_for(lambda: where(held.pk) == [("axa_queue", "completed")], what="the held job done in place")
    later = jobs.add.perform_later(2)
    wait_for(lambda: where(later.pk) == [("axa_history", "completed")], what="a later job done")
    assert proc.poll() is None, "the worker died"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    out = proc.stdout.read()
    assert f"the outcome of job tests.testapp.jobs.add {held.pk} could not move into the history" in out
    health = workers.manage("jobhealth")
    assert "1 finished job(s) kept in axa_queue" in health.stdout, health.stdout + health.stderr


def lost_row(name: str, args: dict[str, Any], losses: int = 0) -> uuid.UUID:
    """A row running under a worker that is gone (no axa_worker row): the rescue's to take."""
    job_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts, losses) "
            "VALUES (%s, %s, %s, 'running', %s, now(), 1, %s)",
            [job_id, name, json.dumps(args), uuid.uuid4(), losses],
        )
    return job_id


def test_the_rescue_isolates_a_refused_row_and_every_other_lost_job_runs_again(constrained: Any) -> None:
    # At its last loss the rescue fails the job, which moves it: the constraint refuses.
    spent = lost_row("tests.testapp.jobs.add", {"a": 1}, losses=2)
    Report.objects.create(job_id=spent)
    others = [lost_row("tests.testapp.jobs.add", {"a": i}) for i in range(5)]
    burst()
    assert where(spent) == [("axa_queue", "failed")]
    job = Job.objects.get(pk=spent)
    assert job.error.startswith("WorkerLost:") and len(refused_entries(job)) == 1
    for job_id in others:
        assert where(job_id) == [("axa_history", "completed")]


def test_cancel_isolates_a_refused_row_and_cancels_the_others(constrained: Any) -> None:
    held, *rest = [jobs.add.perform_later(i) for i in range(4)]
    Report.objects.create(job=held)
    assert Job.objects.filter(pk__in=[held.pk, *(j.pk for j in rest)]).cancel() == 4
    assert where(held.pk) == [("axa_queue", "cancelled")] and len(refused_entries(held)) == 1
    for job in rest:
        assert where(job.pk) == [("axa_history", "cancelled")]


def test_a_users_trigger_refusing_a_retry_leaves_that_job_failed_and_retries_the_others() -> None:
    failing = [jobs.bad_result.perform_later() for _ in range(3)]
    burst()
    stuck = failing[0].pk
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION testapp_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF NEW.id = '{stuck}' THEN RAISE EXCEPTION 'refused by the user''s trigger'; END IF; "
            "RETURN NEW; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER testapp_refuse BEFORE INSERT ON axa_queue FOR EACH ROW EXECUTE FUNCTION testapp_refuse()"
        )
    try:
        result = Job.objects.filter(pk__in=[j.pk for j in failing]).retry()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER testapp_refuse ON axa_queue")
            cursor.execute("DROP FUNCTION testapp_refuse()")
    assert result == 2
    assert list(result.refused) == [stuck] and "refused by the user's trigger" in result.refused[stuck]
    assert where(stuck) == [("axa_history", "failed")]
    for job in failing[1:]:
        assert where(job.pk) == [("axa_queue", "queued")]


def test_pruning_passes_over_a_refused_row_and_deletes_the_others(constrained: Any) -> None:
    held = jobs.add.perform_later(1)
    Report.objects.create(job=held)
    others = [jobs.add.perform_later(i) for i in range(5)]
    burst()  # held: completed in place, in axa_queue; the others in the history
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axa_queue SET created_at = now() - interval '30 days', updated_at = now() - interval '30 days'"
        )
    assert pruning.prune(datetime.timedelta(days=7)) == 5
    assert where(held.pk) == [("axa_queue", "completed")]
    assert all(where(job.pk) == [] for job in others)
    assert pruning.prune(datetime.timedelta(days=7)) == 0  # passed over, not tried again


def test_a_worker_subprocess_is_not_stopped_by_a_refused_rescue(constrained: Any, workers: Any) -> None:
    spent = lost_row("tests.testapp.jobs.add", {"a": 1}, losses=2)
    Report.objects.create(job_id=spent)
    other = lost_row("tests.testapp.jobs.add", {"a": 2})
    proc = workers.start("--burst")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert where(spent) == [("axa_queue", "failed")]
    assert where(other) == [("axa_history", "completed")]


def test_the_seed_sql_leaves_no_second_row_for_a_referenced_job_finished_by_the_seed(constrained: Any) -> None:
    # The seed's FINISH (an UPDATE) is moved by axa_history_keep: a refused move fails that
    # statement for the Rust worker, as any constraint of the user's would; nothing is duplicated.
    job = jobs.add.perform_later(1)
    Report.objects.create(job=job)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET status = 'running' WHERE id = %s", [job.pk])
    with pytest.raises(Exception, match="refapp_report_job_fk"), connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET status = 'completed', updated_at = now() WHERE id = %s", [job.pk])
    assert where(job.pk) == [("axa_queue", "running")]


# -- a second row with a job's id (raw SQL: the ORM and the seed never write one) ------


def copy_into_history(job_id: uuid.UUID) -> None:
    """A completed copy of the row in the history, as save() racing the finish left one on 15e87c7."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_history SELECT (q).* FROM (SELECT q FROM ONLY axa_queue q WHERE id = %s) AS s", [job_id]
        )
        cursor.execute("UPDATE axa_history SET status = 'completed', finished_at = now() WHERE id = %s", [job_id])


def test_the_finisher_meets_an_id_already_in_the_history_and_finishes_every_other_job() -> None:
    before = [jobs.add.perform_later(i) for i in range(10)]
    twice = jobs.add.perform_later(100)
    after = [jobs.add.perform_later(i) for i in range(10)]
    copy_into_history(twice.pk)
    burst()  # exits 0: on 15e87c7 the finisher thread died on the history's primary key (exit 1)
    for job in [*before, *after]:
        assert where(job.pk) == [("axa_history", "completed")]
    assert ("axa_history", "completed") in where(twice.pk)


def test_the_rescue_meets_an_id_already_in_the_history_and_every_other_lost_job_runs() -> None:
    spent, others = uuid.uuid4(), [uuid.uuid4() for _ in range(5)]
    with connection.cursor() as cursor:
        for job_id, losses in [(spent, 2), *((other, 0) for other in others)]:
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, status, worker_id, started_at, attempts, losses) "
                "VALUES (%s, %s, %s, 'running', %s, now(), 1, %s)",
                [job_id, jobs.add.name, json.dumps({"a": 1}), uuid.uuid4(), losses],
            )
    copy_into_history(spent)
    burst()  # the spent job's failure cannot move; the rescue goes row by row
    for job_id in others:
        assert where(job_id) == [("axa_history", "completed")]
