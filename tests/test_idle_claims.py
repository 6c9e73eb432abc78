"""A worker whose last claim found all there was claims again on news, not on every job's end.

With a poll interval of a minute and a lease of 90 s, a wake-up the worker missed would
cost 30 s: each test waits for its job far less than that. Each path that makes rows
claimable again is here: a retry written by the finisher, a row enqueued while every
thread was busy, a limited job's slot freed on the same worker, a child released by its
parent's end.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from axa_django import Job, queues
from axa_django.models import QueueLimit, QueuePause, Worker
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import flow_jobs, jobs, workflow_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

# A missed wake-up would show as a wait of 30 s (the poll interval, and the housekeeping
# interval, a third of the lease, that also bounds an idle wait).
SETTINGS = {"AXA_TEST_POLL": "60", "AXA_TEST_LEASE": "90"}
PROMPT = 10.0  # each job must start well within that


def start(workers, concurrency: int = 1):
    proc = workers.start("--concurrency", str(concurrency), env=workers.env(**SETTINGS))
    jobs.add.perform_later(1)  # warm: the worker is up and idle once this ran
    wait_for(lambda: Job.objects.filter(status="completed").count() == 1, what="the worker to start")
    return proc


def dispatcher_idle_for(seconds: float) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'axa_django dispatcher' AND state = 'idle' "
            "AND state_change < now() - make_interval(secs => %s))",
            [seconds],
        )
        return cursor.fetchone()[0]


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_retry_written_by_the_finisher_runs_without_waiting_for_a_poll(workers, tmp_path) -> None:
    log = tmp_path / "log"
    start(workers)
    jobs.flaky.perform_later(str(log))  # fails twice, backoff 0: queued again at once
    wait_for(lambda: len(lines(log)) == 3, timeout=PROMPT, what="the flaky job's three runs")


def test_a_row_enqueued_while_every_thread_was_busy_runs_when_one_frees(workers, tmp_path) -> None:
    log = tmp_path / "log"
    start(workers)
    jobs.slow.perform_later(1.0, log=str(log), token="busy")
    wait_for(lambda: any(line.startswith("start busy") for line in lines(log)), what="the thread to be busy")
    jobs.slow.perform_later(0, log=str(log), token="next")  # its NOTIFY comes while no thread is free
    wait_for(lambda: any(line.startswith("end next") for line in lines(log)), timeout=PROMPT, what="the next job")


def test_a_limited_jobs_follower_runs_when_its_leader_ends_on_the_same_worker(workers, tmp_path) -> None:
    log = tmp_path / "log"
    start(workers, concurrency=2)
    flow_jobs.one_per_account.perform_later(7, "leader", str(log), seconds=1.0)
    flow_jobs.one_per_account.perform_later(7, "follower", str(log), seconds=0)
    wait_for(
        lambda: Job.objects.filter(name=flow_jobs.one_per_account.name, status="completed").count() == 2,
        timeout=PROMPT,
        what="the leader and then its follower",
    )


def test_a_child_runs_when_its_parent_ends(workers, tmp_path) -> None:
    log = tmp_path / "log"
    start(workers)
    parent = workflow_jobs.step.perform_later("parent", str(log), seconds=0.5)
    workflow_jobs.step.using(after=[parent]).perform_later("child", str(log))
    wait_for(lambda: "end child" in lines(log), timeout=PROMPT, what="the child")


def test_a_slot_freed_in_a_limited_queue_is_taken_by_the_next_row(workers, tmp_path) -> None:
    log = tmp_path / "log"
    queues.limit("default", 1)
    start(workers, concurrency=2)
    jobs.slow.perform_later(1.0, log=str(log), token="first")
    jobs.slow.perform_later(0, log=str(log), token="second")  # waits for the queue's one slot
    wait_for(lambda: "end first" in " ".join(lines(log)), what="the first job")
    wait_for(lambda: any(line.startswith("end second") for line in lines(log)), timeout=PROMPT, what="the second")


def test_a_limit_lifted_by_the_orm_hands_the_waiting_rows_to_an_idle_thread(workers, tmp_path) -> None:
    # Not through queues.unlimit (which says so in its statement): a row deleted by the
    # ORM, or by psql, is announced by the table's trigger.
    log = tmp_path / "log"
    queues.limit("default", 1)
    start(workers, concurrency=2)
    jobs.slow.perform_later(30.0, log=str(log), token="holder")
    jobs.slow.perform_later(0, log=str(log), token="waiter")
    wait_for(lambda: any(line.startswith("start holder") for line in lines(log)), what="the holder to start")
    # Once the worker waits for news: longer idle than any recheck of its own (a second).
    wait_for(lambda: dispatcher_idle_for(1.5), what="the dispatcher to wait for news")
    assert QueueLimit.objects.filter(queue="default").delete()[0] == 1
    wait_for(lambda: any(line.startswith("end waiter") for line in lines(log)), timeout=PROMPT, what="the waiter")


def test_a_scheduled_job_moved_earlier_by_the_orm_runs_at_once(workers, tmp_path) -> None:
    log = tmp_path / "log"
    start(workers)
    job = jobs.slow.using(delay=datetime.timedelta(hours=1)).perform_later(0, log=str(log), token="moved")
    wait_for(lambda: dispatcher_idle_for(1.5), what="the dispatcher to wait for news")
    Job.objects.filter(pk=job.pk).update(run_at=timezone.now())
    wait_for(lambda: "end moved" in " ".join(lines(log)), timeout=PROMPT, what="the job moved earlier")


def test_a_queue_resumed_by_the_orm_hands_its_rows_to_an_idle_worker(workers, tmp_path) -> None:
    log = tmp_path / "log"
    queues.pause("default")
    proc = workers.start("--concurrency", "1", env=workers.env(**SETTINGS))
    jobs.slow.perform_later(0, log=str(log), token="resumed")  # waits in the paused queue
    wait_for(lambda: Worker.objects.filter(pid=proc.pid).exists(), what="the worker to register")
    wait_for(lambda: dispatcher_idle_for(1.5), what="the dispatcher to wait for news")
    assert QueuePause.objects.filter(queue="default").delete()[0] == 1
    wait_for(lambda: "end resumed" in " ".join(lines(log)), timeout=PROMPT, what="the job of the resumed queue")


def test_rows_behind_the_floors_on_a_new_connection_are_claimed_without_waiting_for_the_look(workers) -> None:
    # After a crash or a failover the rows queued again (the reconcile, the rescue) are older
    # than every floor learnt on the server before, and their notifications can go before the
    # listener is back: here, rows written without triggers, and the dispatcher's connection cut.
    proc = workers.start("--concurrency", "1", "--prefetch", "0", env=workers.env(**SETTINGS))
    jobs.add.perform_later(1)  # the floors learn this row's run_at
    wait_for(lambda: Job.objects.filter(status="completed").count() == 1, what="the worker to start")
    wait_for(lambda: dispatcher_idle_for(1.5), what="the dispatcher to wait for news")
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # no trigger: no NOTIFY
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), %s, '{\"a\": 1}', "
            "now() - interval '1 hour' FROM generate_series(1, 20)",
            [jobs.add.name],
        )
        cursor.execute("SET session_replication_role = DEFAULT")
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'axa_django dispatcher'"
        )
        assert cursor.fetchone()[0] == 1
    jobs.add.perform_later(2)  # wakes the dispatcher: its claim fails, it reconnects
    # One row a claim (--prefetch 0): on the floors learnt before, all but the first
    # waited for the look, 30 s at this lease.
    wait_for(
        lambda: Job.objects.filter(status="completed").count() == 22, timeout=PROMPT, what="every row behind the floors"
    )
    assert proc.poll() is None
