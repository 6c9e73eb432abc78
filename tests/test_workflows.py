"""Workflows: dependencies (after=), fan-out/fan-in, workflow() and batch(), with real workers."""

import signal
import time
import uuid
from pathlib import Path

import pytest
from django.db import connection

from axa_django import Job
from tests.conftest import wait_for
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db(transaction=True)


def lines(path) -> list[str]:
    p = Path(path)
    return p.read_text().splitlines() if p.exists() else []


def status(job) -> str:
    return Job.objects.get(pk=job.pk).status


def statuses(jobs) -> list[str]:
    found = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("id", "status"))
    return [found[j.pk] for j in jobs]


def drained(*jobs):
    return lambda: all(s in ("completed", "failed", "cancelled") for s in statuses(jobs))


def test_a_child_waits_for_its_parent_and_runs_after_it(workers, log_file):
    a = wj.step.perform_later("a", log_file)
    b = wj.step.using(after=[a]).perform_later("b", log_file)
    assert status(b) == "waiting" and Job.objects.get(pk=b.pk).pending_parents == 1
    workers.start("--concurrency", "2")
    wait_for(drained(a, b), what="both done")
    assert statuses([a, b]) == ["completed", "completed"]
    assert lines(log_file) == ["start a", "end a", "start b", "end b"]
