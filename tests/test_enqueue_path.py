"""perform_later's lean path: it still shows in Django's query capture, wraps errors and honours broken transactions."""

import datetime

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.signals import post_init
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from axa_django import Job
from tests.conftest import AXA_APPS
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def test_an_enqueue_shows_in_djangos_query_capture():
    with CaptureQueriesContext(connection) as captured:
        jobs.add.perform_later(1, 2)
        jobs.add.perform_later_many([{"a": 3}])
    inserts = [query["sql"] for query in captured.captured_queries if "INSERT INTO axa_queue" in query["sql"]]
    assert len(inserts) == 2


def test_an_enqueue_in_a_broken_transaction_is_refused_as_django_refuses_any_query():
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
        with pytest.raises(TransactionManagementError):
            jobs.add.perform_later(1)
    assert not Job.objects.exists()


def test_a_database_error_from_an_enqueue_is_djangos_error(settings):
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE axa_queue IN ACCESS EXCLUSIVE MODE")
            cursor.execute("ALTER TABLE axa_queue RENAME TO axa_queue_away")
        with pytest.raises(DatabaseError, match="axa_queue"):
            jobs.add.perform_later(1)
        transaction.set_rollback(True)
    assert jobs.add.perform_later(2).args == {"a": 2}


def test_a_listener_to_jobs_init_hears_every_job_a_bulk_enqueue_returns():
    heard = []

    def listen(sender, instance, **kwargs):
        heard.append(instance)

    post_init.connect(listen, sender=Job)
    try:
        created = jobs.add.perform_later_many([{"a": i} for i in range(3)])
    finally:
        post_init.disconnect(listen, sender=Job)
    assert [job.args for job in created] == [{"a": 0}, {"a": 1}, {"a": 2}]
    assert heard == list(created)
    after = jobs.add.perform_later_many([{"a": 3}])
    assert len(heard) == 3 and after[0].args == {"a": 3}


def test_a_plain_enqueue_sends_only_what_its_columns_defaults_do_not_say_and_reads_back_one_time():
    with CaptureQueriesContext(connection) as captured:
        job = jobs.add.perform_later(1, 2)
    (insert,) = [query["sql"] for query in captured.captured_queries if "INSERT INTO axa_queue" in query["sql"]]
    assert insert.startswith("INSERT INTO axa_queue (id, name, args) VALUES (")
    assert insert.endswith("RETURNING created_at")
    row = Job.objects.get(pk=job.pk)
    assert job.created_at == job.updated_at == job.run_at == row.created_at == row.updated_at == row.run_at
    assert (job.queue, job.priority, job.max_attempts, job.timeout) == ("default", 0, None, None)
    assert (row.queue, row.priority, row.max_attempts, row.timeout) == ("default", 0, None, None)


@pytest.mark.parametrize(
    "options",
    [
        {"queue": "q2", "priority": -3},
        {"delay": datetime.timedelta(seconds=30)},
        {"run_at": datetime.datetime(2101, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)},
        {"run_at": datetime.datetime(2001, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)},
        {"max_attempts": 7, "unique_key": "k", "timeout": 2.5, "max_losses": 4},
        {"queue": "default", "priority": 0},
    ],
)
def test_an_enqueue_with_options_writes_each_and_returns_the_rows_own_times(options):
    job = jobs.add.using(**options).perform_later(1, 2)
    row = Job.objects.get(pk=job.pk)
    for field in ("run_at", "created_at", "updated_at", "queue", "priority", "max_attempts", "unique_key", "timeout"):
        assert getattr(job, field) == getattr(row, field), field
    assert row.max_losses == options.get("max_losses")
    if "delay" in options:
        assert row.run_at - row.created_at == options["delay"]
    if "run_at" in options:  # a past run_at means now (docs/jobs.md)
        assert row.run_at == max(options["run_at"], row.created_at)
    if "queue" in options:
        assert (row.queue, row.priority) == (options["queue"], options["priority"])
