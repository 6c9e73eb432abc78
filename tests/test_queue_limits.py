"""Fleet-wide queue limits: at most N jobs of a queue run at once across every worker (issue 21, item 4)."""

from __future__ import annotations

import signal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from axa_django import queues
from axa_django.models import Job
from tests.conftest import wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def most_at_once(log: str, tokens: set[str]) -> int:
    """The most runs of ``tokens`` ever between their start and end line at once, by the log's order."""
    running = most = 0
    for line in Path(log).read_text().splitlines():
        what, token, _pid = line.split(" ")
        if token in tokens:
            running += 1 if what == "start" else -1
            most = max(most, running)
    return most


def stop(procs) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0


@pytest.mark.halved
@pytest.mark.parametrize("queue_workers", [False, True], ids=["all-queues", "queue-workers"])
def test_four_workers_run_at_most_the_limit_of_a_queue_and_the_rest_freely(workers, log_file, queue_workers) -> None:
    assert queues.limit("reports", 2, by="test") is None
    reports = {f"r{i}" for i in range(12)}
    for token in sorted(reports):
        jobs.slow.using(queue="reports").perform_later(0.3, log=log_file, token=token)
    others = {f"o{i}" for i in range(8)}
    if not queue_workers:
        for token in sorted(others):
            jobs.slow.perform_later(0.3, log=log_file, token=token)
    args = ["--concurrency", "4", *(["--queue", "reports"] if queue_workers else [])]
    procs = [workers.start(*args) for _ in range(4)]
    wait_for(lambda: Job.objects.filter(status="completed").count() == Job.objects.count(), timeout=60, what="drain")
    stop(procs)
    assert most_at_once(log_file, reports) == 2  # never more, and the limit is used
    if not queue_workers:
        assert most_at_once(log_file, others) >= 3  # other queues are not held to it
    starts = [line for line in Path(log_file).read_text().splitlines() if line.startswith("start")]
    assert len(starts) == len(reports) + (0 if queue_workers else len(others))  # each ran once


def test_a_limit_set_raised_and_lifted_while_workers_run_takes_effect(workers, log_file) -> None:
    queues.limit("reports", 1)
    first = {f"a{i}" for i in range(8)}
    for token in sorted(first):
        jobs.slow.using(queue="reports").perform_later(0.5, log=log_file, token=token)
    procs = [workers.start("--concurrency", "3") for _ in range(2)]
    wait_for(lambda: Job.objects.filter(status="completed").count() >= 2, timeout=30, what="two runs one at a time")
    assert queues.limit("reports", 3) == 1  # raised: the running workers use the new limit
    wait_for(lambda: Job.objects.filter(status="completed").count() == len(first), timeout=30, what="the first lot")
    assert queues.unlimit("reports") == 3
    second = {f"b{i}" for i in range(6)}
    for token in sorted(second):
        jobs.slow.using(queue="reports").perform_later(0.5, log=log_file, token=token)
    wait_for(lambda: not Job.objects.exclude(status="completed").exists(), timeout=60, what="drain")
    stop(procs)
    runs = Path(log_file).read_text().splitlines()
    assert [line.split(" ")[0] for line in runs[:4]] == ["start", "end", "start", "end"]  # one at a time
    assert most_at_once(log_file, first) == 3
    assert most_at_once(log_file, second) >= 4  # lifted: no limit at all
    assert queues.limits() == {}


@pytest.mark.halved
def test_a_dead_workers_jobs_give_the_queue_its_slots_back(workers, log_file) -> None:
    queues.limit("reports", 1)
    first = jobs.slow.using(queue="reports").perform_later(60, log=log_file, token="held")
    victim = workers.start("--concurrency", "2")
    wait_for(lambda: Path(log_file).read_text().startswith("start held"), what="the held job to start")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    Job.objects.filter(pk=first.pk).update(args={"seconds": 0.1, "log": log_file, "token": "held"})
    second = jobs.slow.using(queue="reports").perform_later(0.1, log=log_file, token="next")
    rescuer = workers.start("--concurrency", "2")
    wait_for(lambda: Job.objects.filter(status="completed").count() == 2, timeout=60, what="both jobs")
    stop([rescuer])
    assert Job.objects.get(pk=first.pk).losses == 1 and Job.objects.get(pk=second.pk).attempts == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", 2**31])
def test_a_bad_limit_is_refused_before_any_sql(bad, django_assert_num_queries) -> None:
    with django_assert_num_queries(0), pytest.raises(ValueError, match="max_running must be a whole number from 1"):
        queues.limit("reports", bad)


def test_the_queues_command_sets_shows_and_lifts_a_limit() -> None:
    out = StringIO()
    call_command("queues", "limit", "reports", "5", stdout=out)
    assert out.getvalue().strip() == "queue 'reports': at most 5 running across all workers (was: no limit)"
    listed = StringIO()
    call_command("queues", stdout=listed)
    (row,) = [line for line in listed.getvalue().splitlines() if line.startswith("reports")]
    assert "at most 5 running" in row
    out = StringIO()
    call_command("queues", "limit", "reports", "none", stdout=out)
    assert out.getvalue().strip() == "queue 'reports': no limit across all workers (was: at most 5 running)"
    assert queues.limits() == {}
    with pytest.raises(CommandError, match="'zero' is not a limit: give a whole number from 1 to 2147483647"):
        call_command("queues", "limit", "reports", "zero")
