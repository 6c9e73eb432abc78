"""perform_later's lean path: it still shows in Django's query capture, wraps errors and honours broken transactions."""

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
