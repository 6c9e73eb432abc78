"""What an idle worker asks the database at each poll: its claim, and no more while nothing is
announced. The limits of queues and the time of its next due row were asked at every poll
too (three statements a second a worker: 2.8% of a core for 32 idle workers)."""

from __future__ import annotations

import contextlib
import datetime
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from axa_django import Job, queues
from axa_django.models import QueuePause
from axa_django.worker import Worker, connect, queuelimits
from axa_django.worker.queuelimits import QueueClaim
from tests.conftest import AXA_APPS, wait_for
from tests.test_flow_concurrency import counted
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

POLL = 0.02


@pytest.fixture
def idle_worker(settings: Any) -> Iterator[tuple[Worker, Any, Any]]:
    # A polled fleet's idle worker claims every LEASE_SECONDS / 3 without news (tests/test_fleet_poll.py).
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "LEASE_SECONDS": 0.9}
    worker = Worker(install_signals=False, concurrency=1, poll_interval=POLL)
    claims = counted(worker.claimer, "claim")
    statements = counted(worker.db, "execute", by_first_argument=True)
    thread = threading.Thread(target=worker.run, name="test worker")
    thread.start()
    try:
        yield worker, claims, statements
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()


def next_runs(statements: Any) -> int:
    return sum(count for text, count in statements.items() if "LEAST(min(run_at)" in text)


def test_an_idle_worker_asks_for_its_next_due_row_again_only_after_news(idle_worker) -> None:
    worker, claims, statements = idle_worker

    def polls() -> int:
        return claims["claim"]

    wait_for(lambda: worker.listener.listening.is_set() and polls() >= 5, what="the worker to poll")
    asked, before = next_runs(statements), polls()
    wait_for(lambda: polls() >= before + 10, what="ten more polls")
    assert next_runs(statements) == asked  # nothing announced: the answer it had holds
    job = jobs.add.using(delay=datetime.timedelta(seconds=0.5)).perform_later(1, b=2)  # announced (NOTIFY): asked again
    wait_for(lambda: next_runs(statements) > asked, what="the look for the new row")
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="the scheduled job run")


def test_limits_are_read_again_on_news_at_most_every_refresh_or_at_every_refresh_unheard(monkeypatch) -> None:
    monkeypatch.setattr(queuelimits, "REFRESH", 0.0)
    claim = QueueClaim(uuid.uuid4(), ["x"], [], None)
    with connect("default", "test limits") as conn:
        conn.autocommit = True
        assert claim.wanted(conn, news=0) is False
        queues.limit("default", 2)
        assert claim.wanted(conn, news=0) is False  # nothing heard: kept (up to REFRESH_HEARD)
        assert claim.wanted(conn, news=1) is True  # news: read again
        queues.unlimit("default")
        assert claim.wanted(conn, news=None) is False  # a worker that hears nothing reads at every REFRESH


@contextlib.contextmanager
def listening() -> Iterator[psycopg.Connection[Any]]:
    with connect("default", "test listener") as conn:
        conn.autocommit = True
        conn.execute("LISTEN axa_queue")
        yield conn


def heard(conn: psycopg.Connection[Any]) -> list[str]:
    """The payloads delivered so far (each statement below committed before this is read)."""
    return [note.payload for note in conn.notifies(timeout=0.3, stop_after=1000)]


def test_a_pause_says_nothing_a_limit_wakes_and_a_lift_or_resume_makes_workers_walk_from_the_start() -> None:
    # 'rescan' makes every worker's next claim walk every lane from its start: only what
    # hands rows back to the plain claim sends it (an upsert fires the UPDATE trigger too).
    with listening() as conn:
        queues.pause("reports")
        assert heard(conn) == []
        queues.limit("reports", 3)
        queues.limit("reports", 4)
        assert heard(conn) == ["", ""]
        queues.unlimit("reports")
        assert heard(conn) == ["rescan"]
        QueuePause.objects.filter(queue="reports").delete()  # resumed by the ORM
        assert heard(conn) == ["rescan"]


def test_a_statement_moving_many_rows_earlier_sends_a_payload_per_second_not_per_row() -> None:
    jobs.add.using(delay=datetime.timedelta(hours=1)).perform_later_many([{"a": n, "b": 0} for n in range(200)])
    with listening() as conn:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE axa_queue SET run_at = now() - interval '10 seconds' + random() * interval '3 seconds' "
                "WHERE status = 'queued'"
            )
        payloads = heard(conn)
    assert 1 <= len(payloads) <= 4 and all(payload.startswith("ready:") for payload in payloads), payloads
