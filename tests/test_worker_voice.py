"""What a running worker says at the default verbosity (issue 45): a periodic summary, the
database coming back after an outage, ready jobs no live worker serves (once, by one worker
of the fleet, with what to do), and a --queue burst worker's last line."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from axa_django import Job, conf, unhandled
from axa_django.unhandled import Unhandled
from axa_django.worker import Worker, connect, logs
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

        # Once started: a connection cut while the worker sets it up is a start that waits
        # for the database ("cannot reach ... yet"), not an outage it comes back from.
        wait_for(lambda: said(caplog, " starting: "), what="the worker's start")
        pid = wait_for(dispatcher, what="the dispatcher's connection")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        [record] = wait_for(lambda: said(caplog, "the database is back"), timeout=15, what="the line")
        job = jobs.add.perform_later(1, b=2)
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="a job run after it")
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("the database is back: the dispatcher reconnected after ")
    assert said(caplog, "dispatcher lost the database")


def test_a_statement_timeout_is_no_outage_the_dispatcher_reconnects_from(caplog):
    # A claim of limited jobs cut short by a statement timeout: the connection works, yet
    # the dispatcher closed it, reconnected and said "the database is back".
    caplog.set_level(logging.INFO, logger="axa_django")
    worker = Worker(concurrency=1, install_signals=False)
    db = worker.db
    assert db.open_first()
    try:
        conn = db.current()
        assert conn is not None
        with pytest.raises(psycopg.errors.QueryCanceled) as raised, conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '10ms'")
            conn.execute("SELECT pg_sleep(5)")
        db.failed("jobs with concurrency limits", raised.value)
        assert db.current() is conn
        assert db.execute("SELECT 1", {}) == [(1,)]
    finally:
        db.close()
    assert said(caplog, "claiming jobs with concurrency limits failed (canceling statement due to statement timeout)")
    assert not said(caplog, "the database is back")


# -- ready jobs no live worker claims ------------------------------------------------------


def insert(name: str, count: int = 1, *, queue: str = "default") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue) SELECT gen_random_uuid(), %s, '{}', %s "
            "FROM generate_series(1, %s)",
            [name, queue, count],
        )


def live_worker(names: list[str], queues: list[str] | None = None, *, age: float = 0) -> uuid.UUID:
    """A live worker's row, as a worker writes it; ``age``: seconds since it started."""
    worker = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at)"
            " VALUES (%s, 'elsewhere', 1, 1, %s, %s, '[]', now() - %s * interval '1 second', now())",
            [worker, json.dumps(queues or []), json.dumps(names), age],
        )
    return worker


@pytest.fixture
def look(caplog: pytest.LogCaptureFixture) -> Iterator[Any]:
    """A running worker's look, as its heartbeat runs it on a worker connection; it returns what was said."""
    unhandled.reset()
    caplog.set_level(logging.WARNING, logger="axa_django")
    with connect("default", "test look") as conn:

        def run(worker: uuid.UUID, now: float | None = None) -> list[Unhandled]:
            lease = float(conf.get("LEASE_SECONDS"))
            return unhandled.look(lambda q, p: conn.execute(q, p).fetchall(), worker=worker, lease=lease, now=now)

        yield run
    unhandled.reset()


def test_only_the_eldest_live_worker_says_it_and_each_once_until_it_is_gone(look, caplog):
    eldest = live_worker(["CountWorker"], age=60)
    younger = live_worker(["CountWorker"])
    insert("NoSuchJob", 2)
    assert look(younger) == []
    assert look(eldest) == [Unhandled("NoSuchJob", None, "default", 2)]
    assert look(eldest) == []  # said once
    [record] = said(caplog, "NoSuchJob")
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("job 'NoSuchJob' in queue 'default': 2 ready and no live worker claims them")
    assert record.getMessage().endswith("; said once, python manage.py jobhealth lists them while it lasts")
    Job.objects.filter(name="NoSuchJob").delete()
    later = time.monotonic() + unhandled.WARN_SECONDS
    assert look(eldest, now=later) == []  # gone: forgotten
    insert("NoSuchJob", 1)
    assert look(eldest, now=later) == [Unhandled("NoSuchJob", None, "default", 1)]  # back: said again


def test_a_key_found_at_every_other_look_is_said_at_most_every_ten_minutes(look, caplog):
    # A pool in a crash loop, a burst worker run by cron: its jobs wait at one look and
    # are gone at the next. Said once and again after each look that missed them, the
    # warning came every other minute.
    eldest = live_worker(["CountWorker"], age=60)
    # Whole seconds: start + 600 - start is 599.99999... for many a float start, which
    # is not yet ten minutes (a CI run started at such a monotonic time said [0, 12]).
    start = float(int(time.monotonic()))
    minutes = []
    for minute in range(22):
        if minute % 2:
            Job.objects.filter(name="NoSuchJob").delete()
        else:
            insert("NoSuchJob")
        if look(eldest, now=start + minute * unhandled.CHECK_SECONDS):
            minutes.append(minute)
    assert minutes == [0, 10, 20]
    assert len(said(caplog, "NoSuchJob")) == 3


def test_the_warning_says_which_queue_to_start_or_which_name_or_queue_was_meant(look, caplog):
    eldest = live_worker(["shop.jobs.send_welcome", "CountWorker"], ["emails", "default"], age=60)
    insert("shop.jobs.send_welcom")  # a name misspelt at enqueue
    insert("CountWorker", queue="emials")  # a queue misspelt
    insert("CountWorker", queue="reports")  # a queue no worker runs yet
    insert("zzz.unknown")  # nothing close
    assert len(look(eldest)) == 4
    messages = {record.getMessage().split(":")[0]: record.getMessage() for record in caplog.records}
    assert (
        "(no live worker runs it: did you mean 'shop.jobs.send_welcome'? (a name misspelt where it was enqueued));"
        in messages["job 'shop.jobs.send_welcom' in queue 'default'"]
    )
    assert (
        "(live workers run this job but none claims from queue 'emials': start one that does (python manage.py "
        "runworker --queue emials); no live worker claims from this queue: did you mean queue 'emails'?);"
    ) in messages["job 'CountWorker' in queue 'emials'"]
    reports = messages["job 'CountWorker' in queue 'reports'"]
    assert "start one that does (python manage.py runworker --queue reports));" in reports, reports
    assert "(is the job in the jobs.py of an installed app" in messages["job 'zzz.unknown' in queue 'default'"]


def test_a_queue_worker_in_burst_names_only_what_it_leaves_in_its_own_queues(caplog):
    caplog.set_level(logging.INFO, logger="axa_django")
    jobs.add.perform_later(1)  # the default queue: not this worker's to run, nor to speak of
    insert("tests.testapp.jobs.ad", queue="emails")  # a misspelt name in its queue
    worker = Worker(queues=["emails"], burst=True, install_signals=False)
    assert worker.run() == 0
    [record] = said(caplog, " stopped after ")
    assert record.levelno == logging.WARNING
    [start] = said(caplog, "in queue 'emails': 1 ready")  # said as it started, with the name it knows
    assert "(no live worker runs it: did you mean 'tests.testapp.jobs.add'?" in start.getMessage()
    assert record.getMessage().endswith(
        "stopped after 0 attempts; ready jobs it could not run: 1 of job 'tests.testapp.jobs.ad' in queue 'emails' "
        "(no job of that name is registered here: did you mean 'tests.testapp.jobs.add'? (a name misspelt where it "
        "was enqueued))"
    ), record.getMessage()


def test_a_job_worker_in_burst_says_nothing_of_other_names(caplog):
    caplog.set_level(logging.INFO, logger="axa_django")
    jobs.add.perform_later(1)
    insert("NoSuchJob")
    assert Worker(names=["CountWorker"], burst=True, install_signals=False).run() == 0
    [record] = said(caplog, " stopped after ")
    assert record.levelno == logging.INFO
    assert record.getMessage().endswith("stopped after 0 attempts"), record.getMessage()
