"""A backoff callable's delay, however odd, becomes a time the database can store."""

import datetime
from pathlib import Path

import pytest
from django.utils import timezone

from axa_django import Job
from tests.conftest import AXA_APPS
from tests.testapp import prefetch_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def test_an_infinite_backoff_queues_the_retry_far_ahead_and_the_worker_lives(workers):
    job = prefetch_jobs.retried_never.perform_later()
    proc = workers.start("--burst")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == ("queued", 1)
    assert row.run_at > timezone.now() + datetime.timedelta(days=365 * 999)


def test_a_nan_backoff_retries_at_once(workers, log_file):
    job = prefetch_jobs.retried_now.perform_later(log=log_file)
    proc = workers.start("--burst")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    assert Job.objects.get(pk=job.pk).status == "completed"
    assert Path(log_file).read_text().splitlines() == ["run", "run"]
