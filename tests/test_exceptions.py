"""One home for exceptions: the class path an attempt's error stores imports back to its class."""

from __future__ import annotations

import inspect

import pytest
from django.db import connection
from django.utils.module_loading import import_string

from axa_django import Job, exceptions
from tests.conftest import AXA_APPS
from tests.testapp import hostile_jobs, jobs

# Entries the worker's SQL writes (a lost or interrupted worker) carry a bare name, as
# the seed's do; the django.tasks side maps them to classes (backends._ENTRY_TYPES).
BARE = {"WorkerLost", "Interrupted"}


def ours() -> list[type[BaseException]]:
    return [
        kind
        for _, kind in inspect.getmembers(exceptions, inspect.isclass)
        if issubclass(kind, BaseException) and kind.__module__ == exceptions.__name__
    ]


def test_every_exception_is_stored_under_a_path_in_axa_django_exceptions_that_imports_back():
    assert {kind.__name__ for kind in ours()} == set(exceptions.__all__) - {"stored_type"}
    for kind in ours():
        path = exceptions.stored_type(kind)
        assert path == f"axa_django.exceptions.{kind.__name__}"
        assert import_string(path) is kind


def test_the_old_import_locations_still_work():
    import axa_django
    from axa_django import arguments, context, execution, selection, worker
    from axa_django.enqueuing import reach, rows

    for module, name in [
        (axa_django, "JobTimeout"),
        (axa_django, "DuplicateJob"),
        (context, "JobCancelled"),
        (context, "JobLost"),
        (execution, "BadResult"),
        (execution, "LeakedTransaction"),
        (execution, "NoHandler"),
        (arguments, "ArgumentsMismatch"),
        (rows, "DuplicateJob"),
        (selection, "UnknownQueues"),
        (worker, "NotMigrated"),
        (worker, "CannotConnect"),
        (worker, "PoolerMisconfigured"),
        (worker, "UnknownJobs"),
        (reach, "UnreachableJobWarning"),
    ]:
        assert getattr(module, name) is getattr(exceptions, name)


REFUSE = """
CREATE FUNCTION axa_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'this result is refused'; END $$;
CREATE TRIGGER axa_test_refuse BEFORE UPDATE ON axa_queue FOR EACH ROW
    WHEN (NEW.result = '"refuse me"'::jsonb) EXECUTE FUNCTION axa_test_refuse();
CREATE TRIGGER axa_test_refuse BEFORE INSERT ON axa_history FOR EACH ROW
    WHEN (NEW.result = '"refuse me"'::jsonb) EXECUTE FUNCTION axa_test_refuse();
"""


@pytest.fixture
def refusing_table():
    """axa_queue refuses to store the result "refuse me" (an outcome the database will not take)."""
    with connection.cursor() as cursor:
        cursor.execute(REFUSE)
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER axa_test_refuse ON axa_queue; DROP TRIGGER axa_test_refuse ON axa_history; "
            "DROP FUNCTION axa_test_refuse()"
        )


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_each_error_a_worker_stores_names_a_class_that_imports_back(workers, refusing_table, log_file):
    expected = {
        jobs.bad_result.perform_later().pk: exceptions.BadResult,
        hostile_jobs.leak_transaction.perform_later("atomic", "marker").pk: exceptions.LeakedTransaction,
        jobs.record.perform_later(token="refuse me", log=log_file).pk: exceptions.UnstorableOutcome,
        jobs.count.perform_later(fail=True).pk: None,  # the job's own exception
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), %s, '{\"nope\": 1}') RETURNING id",
            [jobs.add.name],
        )
        expected[cursor.fetchone()[0]] = exceptions.ArgumentsMismatch
    result = workers.manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    for job in Job.objects.filter(pk__in=expected):
        assert job.status == "failed", (job.name, job.status, job.errors)
        kinds = [import_string(entry["type"]) for entry in job.errors if entry["type"] not in BARE]
        assert kinds and all(issubclass(kind, BaseException) for kind in kinds), job.errors
        if expected[job.pk] is not None:
            assert kinds[-1] is expected[job.pk], job.errors
