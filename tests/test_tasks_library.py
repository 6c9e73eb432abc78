"""A library's tasks (defined with the django-tasks backport in a package that is not an
installed app, as Wagtail's modelsearch.tasks) run on runworker, on Django 5.2 and 6.x."""

import django_tasks
import pytest
from django.apps import apps

from axa_django import Job
from tests.tasklib import tasks as library
from tests.tasklib import unimported

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_library_task_imported_at_start_runs_on_a_worker_and_reads_back_through_the_backport(workers):
    assert not any(app.name.startswith("tests.tasklib") for app in apps.get_app_configs())
    indexed = library.index_page.enqueue(7)
    purged = library.purge.using(queue_name="default").enqueue([])
    stray = unimported.never_at_start.enqueue()
    proc = workers.start("--burst", "--concurrency", "1")
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    # Through the backport's own handler, as the library reads its results.
    backend = django_tasks.task_backends["default"]
    done = backend.get_result(indexed.id)
    assert (done.status, done.return_value) == ("SUCCESSFUL", {"indexed": 7})
    failed = backend.get_result(purged.id)
    assert failed.status == "FAILED" and failed.errors[0].exception_class is ValueError
    # A library module imported only later (here by the test, never by the site at start):
    # the worker does not import it for a row, and says where tasks must live.
    row = Job.objects.get(pk=stray.id)
    assert row.status == "failed" and "is not imported and not inside an installed app" in row.error, row.error
