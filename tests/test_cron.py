"""Periodic jobs: validation, next runs, exactly-once enqueue per tick, listjobs."""

from __future__ import annotations

import datetime
import re
from collections import Counter
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from axa_django import Job, background_job, cron, registry
from axa_django.models import Schedule
from axa_django.registry import JobFunction
from tests.conftest import Workers, wait_for
from tests.test_scheduling import in_threads

UTC = datetime.UTC


def at(hour: int, minute: int, second: int = 0) -> datetime.datetime:
    return datetime.datetime(2026, 1, 1, hour, minute, second, tzinfo=UTC)


def every_five(label: str = "x") -> str:
    return label


def needs_argument(user_id: int) -> None:
    pass


@pytest.fixture
def five() -> Iterator[JobFunction[Any, Any]]:
    """A job on */5 * * * *, registered for one test only so no other test's worker schedules it."""
    job = background_job(name="tests.every_five", cron="*/5 * * * *", queue="cron", priority=3)(every_five)
    yield job
    registry.registry.pop(job.name, None)


def test_invalid_cron_expression_fails_at_decoration() -> None:
    for expression in ("61 * * * *", "every day", "* * *", ""):
        with pytest.raises(ValueError, match="not a valid cron expression"):
            background_job(name="tests.bad_cron", cron=expression)(every_five)
    assert "tests.bad_cron" not in registry.registry


def test_periodic_job_must_need_no_arguments() -> None:
    with pytest.raises(TypeError, match=r"needs argument.*user_id"):
        background_job(name="tests.cron_with_args", cron="* * * * *")(needs_argument)
    assert "tests.cron_with_args" not in registry.registry


def test_next_runs(five: JobFunction[Any, Any]) -> None:
    assert cron.next_runs(five, 3, after=at(0, 2)) == [at(0, 5), at(0, 10), at(0, 15)]
    assert cron.next_runs(five, 1, after=at(0, 5)) == [at(0, 10)]
    upcoming = cron.next_runs(five, 2)
    assert upcoming[0] > datetime.datetime.now(UTC)
    assert upcoming[1] - upcoming[0] == datetime.timedelta(minutes=5)
    assert cron.next_runs(registry.get("tests.testapp.jobs.add"), 3) == []


def test_time_zone_comes_from_cron_timezone_then_time_zone(settings: Any) -> None:
    job = background_job(name="tests.nine_am", cron="0 9 * * *")(every_five)
    try:
        assert cron.next_runs(job, 1, after=at(0, 0)) == [at(9, 0)]  # TIME_ZONE is UTC in the tests
        settings.TIME_ZONE = "America/New_York"
        assert cron.next_runs(job, 1, after=at(0, 0)) == [at(14, 0)]
        settings.AXA_DJANGO = {**settings.AXA_DJANGO, "CRON_TIMEZONE": "Europe/Paris"}
        assert cron.next_runs(job, 1, after=at(0, 0)) == [at(8, 0)]
        assert str(cron.next_runs(job, 1, after=at(0, 0))[0].tzinfo) == "Europe/Paris"
    finally:
        registry.registry.pop(job.name, None)


@pytest.mark.django_db
def test_first_sight_records_without_running_then_each_tick_once(five: JobFunction[Any, Any]) -> None:
    names = [five.name]
    assert cron.schedule(at(0, 7), names=names) == []
    assert Schedule.objects.get(name=five.name).last_run == at(0, 5)
    assert cron.schedule(at(0, 9, 59), names=names) == []
    with pytest.raises(ValueError, match="aware"):
        cron.schedule(datetime.datetime(2026, 1, 1, 0, 10), names=names)

    [job] = cron.schedule(at(0, 10), names=names)
    job.refresh_from_db()
    assert (job.name, job.args, job.status, job.queue, job.priority) == (five.name, {}, "queued", "cron", 3)
    assert job.unique_key == "cron:2026-01-01T00:10:00+00:00"
    assert job.run_at > at(0, 10)  # a past scheduled time runs now
    assert cron.schedule(at(0, 10), names=names) == []
    assert cron.schedule(at(0, 14, 59), names=names) == []
    assert Schedule.objects.get(name=five.name).last_run == at(0, 10)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_after_downtime_only_the_latest_missed_run_is_enqueued(five: JobFunction[Any, Any]) -> None:
    names = [five.name]
    cron.schedule(at(0, 1), names=names)
    [job] = cron.schedule(at(3, 31), names=names)  # 42 occurrences missed
    assert job.unique_key == "cron:2026-01-01T03:30:00+00:00"
    assert Job.objects.count() == 1
    [job] = cron.schedule(at(3, 35), names=names)
    assert job.unique_key == "cron:2026-01-01T03:35:00+00:00"


@pytest.mark.django_db
def test_scheduler_skips_jobs_outside_its_names_and_queues(five: JobFunction[Any, Any]) -> None:
    cron.schedule(at(0, 1), names=[five.name])
    assert cron.schedule(at(0, 6), names=["tests.testapp.jobs.add"]) == []
    assert cron.schedule(at(0, 6), names=[five.name], queues=["default"]) == []
    assert len(cron.schedule(at(0, 6), names=[five.name], queues=["cron"])) == 1


@pytest.mark.django_db(transaction=True)
def test_four_concurrent_schedulers_enqueue_each_tick_once(five: JobFunction[Any, Any]) -> None:
    cron.schedule(at(1, 0), names=[five.name])
    for minute in range(5, 60, 5):
        written = in_threads(4, lambda _, m=minute: cron.schedule(at(1, m, 1), names=[five.name]))
        assert sum(len(jobs) for jobs in written) == 1, f"tick 01:{minute:02} enqueued {written}"
    keys = Counter(Job.objects.values_list("unique_key", flat=True))
    assert keys == Counter({f"cron:2026-01-01T01:{m:02}:00+00:00": 1 for m in range(5, 60, 5)})


@pytest.mark.django_db(transaction=True)
def test_four_workers_enqueue_a_per_second_cron_job_once_per_tick(workers: Workers) -> None:
    env = workers.env(AXA_TEST_CRON="1")
    for _ in range(4):
        workers.start("--concurrency", "2", env=env)

    wait_for(
        lambda: Job.objects.filter(name="tests.every_second", status="completed").count() >= 4,
        timeout=60,
        what="four ticks of tests.every_second completed",
    )

    rows = list(Job.objects.filter(name="tests.every_second").values_list("unique_key", "status", "attempts"))
    keys = Counter(key for key, _, _ in rows)
    assert keys.most_common(1)[0][1] == 1, f"a tick was enqueued twice: {keys.most_common(3)}"
    assert all(re.fullmatch(r"cron:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", key) for key in keys)
    assert all(attempts <= 1 for _, status, attempts in rows if status != "queued")
    assert len(Schedule.objects.filter(name="tests.every_second")) == 1
    assert {s for _, s, _ in rows} <= {"queued", "running", "completed"}
    results = set(Job.objects.filter(name="tests.every_second", status="completed").values_list("result", flat=True))
    assert results == {"tick"}


@pytest.mark.django_db
def test_listjobs_prints_every_job_with_options_and_schedule(five: JobFunction[Any, Any]) -> None:
    out = StringIO()
    call_command("listjobs", stdout=out)
    text = out.getvalue()
    lines = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert text.splitlines()[0].split()[:4] == ["NAME", "QUEUE", "PRIORITY", "MAX_ATTEMPTS"]
    assert set(lines) == set(registry.registry)
    assert lines["tests.testapp.jobs.add"][1:] == ["default", "0", "1", "-", "-"]
    assert lines["tests.testapp.jobs.flaky"][3] == "3"
    assert lines["tests.testapp.jobs.send_email"][1:3] == ["emails", "5"]
    row = lines["tests.every_five"]
    assert row[1:4] == ["cron", "3", "1"]
    assert row[4:9] == ["*/5", "*", "*", "*", "*"]
    next_run = datetime.datetime.fromisoformat(row[9])
    assert next_run > datetime.datetime.now(UTC)
    assert next_run.minute % 5 == 0 and next_run.second == 0


@pytest.mark.django_db(transaction=True)
def test_worker_housekeeping_schedules_only_jobs_it_could_run(five: JobFunction[Any, Any]) -> None:
    from axa_django.worker import Worker

    assert Worker(burst=True, install_signals=False, queues=["default"]).run() == 0
    assert not Schedule.objects.exists()
    assert Worker(burst=True, install_signals=False, names=["tests.testapp.jobs.add"]).run() == 0
    assert not Schedule.objects.exists()

    assert Worker(burst=True, install_signals=False, queues=["cron"]).run() == 0
    # First sight: the latest occurrence is recorded, nothing runs yet.
    assert Schedule.objects.get().name == five.name
    assert cron.due(five, Schedule.objects.get().last_run) == Schedule.objects.get().last_run
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_failing_schedule_does_not_stop_the_worker(
    five: JobFunction[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    from axa_django.worker import Worker
    from tests.testapp import jobs

    five.cron = "not a cron expression"  # as if the registry held something broken
    job = jobs.add.perform_later(1, 2)
    assert Worker(burst=True, install_signals=False).run() == 0
    job.refresh_from_db()
    assert job.result == 3
    assert "housekeeping failed" in caplog.text
