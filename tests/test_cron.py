"""Periodic jobs: validation, next runs, every occurrence once with bounded catch-up, timeouts, listjobs."""

from __future__ import annotations

import datetime
import itertools
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from axa_django import Job, background_job, cron, housekeeping, registry
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


@pytest.mark.halved
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


# -- catch-up: every occurrence once, whatever the housekeeping interval ------------------


def seconds(*offsets: int) -> list[str]:
    """Unique keys of the per-second occurrences at 02:00:00 plus each offset."""
    return [cron.unique_key(at(2, 0) + datetime.timedelta(seconds=s)) for s in offsets]


@dataclass
class Housekeeper:
    """The little of a worker that housekeeping.run reads."""

    names: list[str]
    queues: list[str] | None = None
    using: str = "default"

    def handler_names(self) -> list[str]:
        return self.names


@contextmanager
def held(statement: str) -> Iterator[threading.Event]:
    """Hold the lock ``statement`` takes, in another connection's transaction, until the block ends or the event is set."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(statement)
                taken.set()
                release.wait(timeout=120)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(timeout=30), f"could not {statement}"
        yield release
    finally:
        release.set()
        thread.join(timeout=60)


def finishes(call: Callable[[], Any], release: threading.Event, what: str) -> Any:
    """Run ``call`` in a thread with its own connection; fail if it still waits after a generous deadline."""
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(call())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: not thread.is_alive(), timeout=30, what=what)
    finally:
        release.set()  # a call still waiting for the lock gets it now and ends
        thread.join(timeout=60)
    return results[0]


@pytest.fixture
def per_second() -> Iterator[JobFunction[Any, Any]]:
    """A job on '* * * * * *' (croniter's seconds field is the last), for one test only."""
    job = background_job(name="tests.per_second", cron="* * * * * *")(every_five)
    yield job
    registry.registry.pop(job.name, None)


@pytest.mark.django_db
def test_housekeeping_every_ten_seconds_enqueues_every_second_once(per_second: JobFunction[Any, Any]) -> None:
    names = [per_second.name]
    start = at(2, 0) + datetime.timedelta(milliseconds=300)
    assert cron.schedule(start, names=names) == []  # first sight: 02:00:00
    keys = []
    for step in range(1, 7):
        keys += [job.unique_key for job in cron.schedule(start + datetime.timedelta(seconds=10 * step), names=names)]
    assert keys == seconds(*range(1, 61))
    assert Schedule.objects.get(name=per_second.name).last_run == at(2, 1)


@pytest.mark.django_db
def test_every_five_seconds_gets_25_35_and_45() -> None:
    job = background_job(name="tests.every_five_seconds", cron="* * * * * */5")(every_five)
    try:
        assert cron.schedule(at(2, 0, 20), names=[job.name]) == []
        keys = [j.unique_key for now in (30, 40, 50) for j in cron.schedule(at(2, 0, now), names=[job.name])]
        assert keys == seconds(25, 30, 35, 40, 45, 50)
    finally:
        registry.registry.pop(job.name, None)


@pytest.mark.django_db
def test_catch_up_is_the_last_minute_then_only_the_latest(per_second: JobFunction[Any, Any]) -> None:
    names = [per_second.name]
    cron.schedule(at(2, 0), names=names)
    # Five minutes down: the occurrences of the last CATCH_UP (60 s) run, older ones do not.
    keys = [job.unique_key for job in cron.schedule(at(2, 5), names=names)]
    assert datetime.timedelta(seconds=60) == cron.CATCH_UP
    assert keys == seconds(*range(241, 301))
    assert cron.occurrences(per_second, at(2, 5), at(2, 5)) == []
    hourly = background_job(name="tests.hourly", cron="0 * * * *")(every_five)
    try:
        # Nothing within the window: only the latest missed occurrence.
        assert cron.occurrences(hourly, at(0, 0), at(5, 30)) == [at(5, 0)]
        assert cron.occurrences(hourly, at(5, 0), at(5, 30)) == []
    finally:
        registry.registry.pop(hourly.name, None)


@pytest.mark.django_db(transaction=True)
def test_concurrent_schedulers_enqueue_every_second_once(per_second: JobFunction[Any, Any]) -> None:
    names = [per_second.name]
    cron.schedule(at(2, 0), names=names)
    written: list[Job] = []
    for step in range(1, 7):
        # Four workers housekeeping at about the same time, their clocks a little apart.
        now = at(2, 0) + datetime.timedelta(seconds=10 * step)
        for jobs in in_threads(
            4, lambda i, now=now: cron.schedule(now + i * datetime.timedelta(seconds=0.3), names=names)
        ):
            written += jobs
    assert sorted(job.unique_key for job in written) == seconds(*range(1, 61))
    assert Counter(Job.objects.values_list("unique_key", flat=True)) == Counter(seconds(*range(1, 61)))


@pytest.mark.django_db
def test_housekeeping_returns_seconds_until_the_next_occurrence(
    per_second: JobFunction[Any, Any], five: JobFunction[Any, Any]
) -> None:
    assert 0 < housekeeping.run(Housekeeper([per_second.name, five.name])) <= 1
    assert 0 < housekeeping.run(Housekeeper([five.name])) <= 300
    assert housekeeping.run(Housekeeper(["tests.testapp.jobs.add"])) is None
    assert housekeeping.run(Housekeeper([five.name], queues=["default"])) is None


# -- housekeeping cannot block the dispatcher for long ----------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_locked_schedule_table_makes_housekeeping_give_up_not_wait(
    per_second: JobFunction[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    worker = Housekeeper([per_second.name])
    housekeeping.run(worker)  # first sight
    with held("LOCK TABLE axa_schedule IN ACCESS EXCLUSIVE MODE") as release:
        waited = finishes(lambda: housekeeping.run(worker), release, "housekeeping to give up on the locked table")
    assert 0 < waited <= 1  # still tells the worker when to come back
    assert "housekeeping failed to schedule periodic jobs" in caplog.text
    assert "lock timeout" in caplog.text
    assert not Job.objects.exists()
    # The timeouts were SET LOCAL: nothing stays on the connection after the step.
    with connection.cursor() as cursor:
        housekeeping.run(worker)
        cursor.execute("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
        assert cursor.fetchone() == ("0", "0")


@pytest.mark.django_db(transaction=True)
def test_a_locked_schedule_row_is_skipped_not_waited_for(per_second: JobFunction[Any, Any]) -> None:
    names = [per_second.name]
    cron.schedule(at(2, 0), names=names)
    with held(f"SELECT * FROM axa_schedule WHERE name = '{per_second.name}' FOR UPDATE") as release:
        # Another worker is scheduling this job right now: skip it at once.
        assert finishes(lambda: cron.schedule(at(2, 0, 10), names=names), release, "a schedule that skips") == []
    assert len(cron.schedule(at(2, 0, 10), names=names)) == 10


@pytest.mark.halved
@pytest.mark.django_db(transaction=True)
def test_a_worker_with_a_long_lease_enqueues_every_second_of_a_per_second_schedule(workers: Workers) -> None:
    # Housekeeping every LEASE_SECONDS / 3 = 10 s: the worker must still wake for each occurrence.
    workers.start("--concurrency", "2", env=workers.env(AXA_TEST_CRON="1", AXA_TEST_LEASE="30"))

    def ticks() -> list[datetime.datetime]:
        keys = Job.objects.filter(name="tests.every_second").values_list("unique_key", flat=True)
        return sorted(datetime.datetime.fromisoformat(key.removeprefix("cron:")) for key in keys)

    wait_for(lambda: len(ticks()) >= 6, timeout=30, what="six ticks of tests.every_second")
    seen = ticks()
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert gaps and all(gap == datetime.timedelta(seconds=1) for gap in gaps), seen
