"""A worker started on a read-only server says so and waits: no crash loop, no job failed.

The server refuses writes to every new session (``default_transaction_read_only``, as a
standby or a managed service whose disk filled refuses them): here this test's own
database, ``ALTER DATABASE ... SET default_transaction_read_only = on``, which reaches
new sessions only, and no other database. Once writes are allowed again the worker works.
A server turned read-only under a working worker (its open sessions too) is
tests/test_failover.py's, on a private cluster: that takes ``ALTER SYSTEM``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models import Count

from axa_django import Job
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
    read_only: Callable[[bool], None], log_file: str, settings: Any
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


def test_a_write_refused_in_a_transaction_the_job_made_read_only_is_the_jobs_own_error() -> None:
    # The server takes writes: the refusal is the job's (it set its transaction read-only), an attempt spent.
    error = None
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION READ ONLY")
        try:
            cursor.execute("DELETE FROM django_migrations WHERE false")
        except DatabaseError as refused:
            error = refused
            raise
    assert error is not None and not dberrors.database_lost(error)
