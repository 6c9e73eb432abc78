"""A worker started on a read-only server says so and waits: no crash loop, no job failed.

The server refuses writes to every new session (``default_transaction_read_only``, as a
standby or a managed service whose disk filled refuses them): here this test's own
database, ``ALTER DATABASE ... SET default_transaction_read_only = on``, which reaches
new sessions only, and no other database. Once writes are allowed again the worker works.
A server turned read-only under a working worker (its open sessions too) is
tests/test_failover.py's, on a private cluster: that takes ``ALTER SYSTEM``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Count

from axa_django import Job, background_job
from axa_django.execution import dberrors
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for
from tests.testapp.jobs import trace, write_nothing

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

SAID = "is read-only (a standby, or default_transaction_read_only is on)"


@pytest.fixture
def read_only(transactional_db: None) -> Iterator[Callable[[bool], None]]:
    """Turn this test's database read-only for new sessions, or back; back for good at the end."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])

    def turn(on: bool) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = off")  # this session writes whatever the database says
            cursor.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = {'on' if on else 'off'}")

    try:
        yield turn
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = off")
            cursor.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")


def statuses() -> dict[str, int]:
    return dict(Job.objects.values_list("status").annotate(n=Count("id")).order_by())


def test_a_worker_started_on_a_read_only_database_says_so_waits_and_works_once_writes_are_allowed(
    read_only: Callable[[bool], None], caplog: pytest.LogCaptureFixture, log_file: str
) -> None:
    total = 3
    for i in range(total):
        trace.perform_later(token=str(i), log=log_file)
    read_only(True)
    worker = Worker(install_signals=False, concurrency=2, poll_interval=0.2)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="read-only worker", daemon=True)
    thread.start()
    try:
        wait_for(lambda: caplog.text.count(SAID) >= 3, 20, what="the worker saying so, again and again")
        assert thread.is_alive(), caplog.text
        assert statuses() == {"queued": total}  # nothing claimed, nothing failed
        read_only(False)
        wait_for(lambda: statuses() == {"completed": total}, 30, what="the jobs done once writes are allowed")
    finally:
        worker.stop()
        thread.join(30)
    assert codes == [0], caplog.text
    assert sorted(Path(log_file).read_text().split()[::2]) == [str(i) for i in range(total)]  # each ran once


def test_a_jobs_write_refused_by_a_read_only_server_is_lost_to_the_database_not_failed(
    read_only: Callable[[bool], None], log_file: str, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "MAX_LOSSES": 1000}  # lost until writes are back
    worker = Worker(install_signals=False, concurrency=1, poll_interval=0.2)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="worker", daemon=True)
    thread.start()
    try:
        trace.perform_later(token="warm", log=log_file)  # no query of its own: its outcome opens the finisher's
        wait_for(lambda: Job.objects.filter(status="completed").exists(), what="the worker's connections opened")
        read_only(True)  # new sessions only: the job thread's, opened at its first query
        job = write_nothing.perform_later(token="written", log=log_file)
        wait_for(lambda: Job.objects.get(pk=job.pk).losses >= 2, what="the refused write lost, twice")
        assert Job.objects.get(pk=job.pk).status != "failed"  # on the code before: failed, its one attempt spent
        read_only(False)  # a lost job's thread drops a connection to a read-only server: the next one writes
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="the write once allowed")
    finally:
        worker.stop()
        thread.join(30)
    assert codes == [0]
    assert Path(log_file).read_text().split()[2:] == ["written"]
    assert "queued again without using an attempt" in caplog.text
    assert "could not be written before the stop" not in caplog.text  # said of every loss, the review found


def add_alias(alias: str, **options: str) -> None:
    """A second DATABASES alias on this test's database, with these connection OPTIONS."""
    settings = copy.deepcopy(connections.settings["default"])
    settings.setdefault("OPTIONS", {}).update(options)
    connections.settings[alias] = settings


def use(alias: str) -> Any:
    """connections[alias], connected (the test case refuses a first query on an alias it does not list)."""
    if connections[alias].connection is None:
        connections[alias].connect()
    return connections[alias]


@pytest.fixture
def reports() -> Iterator[str]:
    """An alias read-only by design (a reporting role, a replica's user): writes refused, the server writable."""
    add_alias("reports", options="-c default_transaction_read_only=on")
    yield "reports"
    for each in connections.all(initialized_only=True):
        if each.alias == "reports":
            each.close()
    connections.settings.pop("reports", None)


def own_read_only_error() -> DatabaseError:
    """A write in a transaction the job made read-only, on a writable server."""
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
        cursor.execute("DELETE FROM django_migrations WHERE false")
    return caught.value


def test_writes_refused_by_the_job_or_the_project_stay_the_jobs_own_errors(reports: str) -> None:
    # The review's cases: each was taken for a lost database (the job ran MAX_LOSSES times).
    assert not dberrors.database_lost(own_read_only_error())
    with use(reports).cursor() as cursor:  # the job read from an alias read-only by design
        cursor.execute("SELECT 1")
    assert not dberrors.database_lost(own_read_only_error())
    with pytest.raises(DatabaseError) as caught, use(reports).cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE false")  # a write sent there by mistake
    assert not dberrors.database_lost(caught.value)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = on")  # the job guards a section of its own
            with pytest.raises(DatabaseError) as caught:
                cursor.execute("DELETE FROM django_migrations WHERE false")
        assert not dberrors.database_lost(caught.value)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_read_only")
    assert dberrors.check_connections() == []  # and no connection of theirs is dropped


RUNS: list[str] = []


@background_job(max_attempts=1)
def write_to_reports(token: str) -> None:
    RUNS.append(token)  # a side effect (an email sent) before the write
    with use("reports").cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE false")


def test_a_one_attempt_job_writing_to_a_read_only_alias_runs_once_and_fails_with_its_error(reports: str) -> None:
    RUNS.clear()
    worker = Worker(install_signals=False, concurrency=1, poll_interval=0.2, names=[write_to_reports.name])
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="worker", daemon=True)
    thread.start()
    try:
        job = write_to_reports.perform_later(token="x")
        wait_for(lambda: Job.objects.get(pk=job.pk).status in ("failed", "completed"), what="the job's end")
    finally:
        worker.stop()
        thread.join(30)
    row = Job.objects.get(pk=job.pk)
    assert codes == [0] and RUNS == ["x"] and row.status == "failed"
    assert "DatabaseLost" not in (row.error or "") and "read-only transaction" in (row.error or "")
