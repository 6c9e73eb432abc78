"""What a running worker says at the default verbosity (issue 45): a periodic summary, the
database coming back after an outage, ready jobs no live worker serves (once, by one worker
of the fleet, with what to do), and a --queue burst worker's last line."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from axa_django import Job
from axa_django.worker import Worker, logs
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if text in record.getMessage()]


@contextlib.contextmanager
def running(caplog: pytest.LogCaptureFixture, **options: Any) -> Iterator[Worker]:
    caplog.set_level(logging.INFO, logger="axa_django")
    worker = Worker(install_signals=False, concurrency=1, **options)
    thread = threading.Thread(target=worker.run, name="test worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


# -- the periodic summary ---------------------------------------------------------------


def test_a_running_worker_says_what_its_attempts_came_to(caplog, monkeypatch):
    monkeypatch.setattr(logs, "SUMMARY_SECONDS", 0.5)
    jobs.count.perform_later(fail=False)
    jobs.count.perform_later(fail=True)
    with running(caplog) as worker:
        [record] = wait_for(lambda: said(caplog, " in the last "), timeout=15, what="the summary line")
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith(f"worker {worker.id}: 2 attempts: 1 completed, 1 failed in the last "), message
    assert message.endswith("s; 0 jobs running"), message


def test_the_summary_is_silent_while_idle_but_for_a_line_every_ten_minutes(caplog):
    caplog.set_level(logging.INFO, logger="axa_django")
    worker_id = uuid.uuid4()
    summary = logs.Summary(worker_id, now=0)
    minute, idle = logs.SUMMARY_SECONDS, logs.IDLE_SUMMARY_SECONDS
    assert summary.tick(0, {}, 0, now=minute - 1) is None  # not due yet
    assert summary.tick(3, {"completed": 2, "queued": 1}, 1, now=minute) == (
        f"worker {worker_id}: 3 attempts: 2 completed, 1 queued again after an error in the last 60s; 1 job running"
    )
    assert summary.tick(3, {"completed": 2, "queued": 1}, 0, now=2 * minute) is None  # idle: nothing said
    assert summary.tick(4, {"completed": 3, "queued": 1}, 0, now=3 * minute) == (
        f"worker {worker_id}: 1 attempt: 1 completed in the last 60s; 0 jobs running"
    )
    for tick in range(4, 12):
        summary.tick(4, {"completed": 3, "queued": 1}, 2, now=tick * minute)
    assert summary.tick(4, {"completed": 3, "queued": 1}, 2, now=3 * minute + idle) == (
        f"worker {worker_id}: no attempt finished in the last 600s; 2 jobs running"
    )
    assert [record.levelno for record in said(caplog, f"worker {worker_id}")] == [logging.INFO] * 3


# -- the database coming back -------------------------------------------------------------


def test_the_dispatcher_says_when_the_database_is_back(caplog):
    with running(caplog):

        def dispatcher() -> int | None:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = 'axa_django dispatcher'"
                )
                row = cursor.fetchone()
            return row[0] if row else None

        pid = wait_for(dispatcher, what="the dispatcher's connection")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        [record] = wait_for(lambda: said(caplog, "the database is back"), timeout=15, what="the line")
        job = jobs.add.perform_later(1, b=2)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="a job run after it")
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("the database is back: the dispatcher reconnected after ")
    assert said(caplog, "dispatcher lost the database")
