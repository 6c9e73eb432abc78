"""Every admin page with USE_TZ = False as with USE_TZ = True, in a time zone that is not UTC (issue 10, item 4.7)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from axa_django import admin as job_admin
from axa_django.models import Job
from axa_django.ops import dashboard

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:axa_django_job_changelist")
FAILED = reverse("admin:axa_django_failedjob_changelist")
DASHBOARD = reverse("admin:axa_django_queuedashboard_changelist")
# One instant, 12:00:00.250 UTC: 07:00:00.250 EST in New York, 17:30:00.250 IST in Kolkata.
INSTANT = "2025-01-15 12:00:00.25+00"
LOCAL = {"America/New_York": ("07:00:00", "EST"), "Asia/Kolkata": ("17:30:00", "IST")}


@pytest.fixture(params=[True, False], ids=["USE_TZ=True", "USE_TZ=False"])
def use_tz(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(params=sorted(LOCAL))
def zone(request: pytest.FixtureRequest, use_tz: bool) -> Iterator[str]:
    with override_settings(USE_TZ=use_tz, TIME_ZONE=request.param):
        yield request.param


def write_rows() -> dict[str, uuid.UUID]:
    """One row in every status, written by SQL as a worker leaves it, every time at INSTANT; and a live worker."""
    ids = {}
    with connection.cursor() as cursor:
        for status in Job.Status.values:
            finished = INSTANT if status in ("completed", "failed", "cancelled") else None
            started = INSTANT if status != "queued" else None
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, status, run_at, created_at, updated_at, started_at, "
                "finished_at, error, attempts) VALUES (gen_random_uuid(), 'tests.testapp.jobs.add', '{\"a\": 1}', "
                "%s, %s, %s, %s, %s, %s, %s, 1) RETURNING id",
                [
                    status,
                    INSTANT,
                    INSTANT,
                    INSTANT,
                    started,
                    finished,
                    "ValueError: boom" if status == "failed" else None,
                ],
            )
            ids[status] = cursor.fetchone()[0]
        # Something finished within the last hour, so the dashboard's chart has a bar to label.
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, started_at, finished_at) "
            "VALUES (gen_random_uuid(), 'tests.testapp.jobs.add', '{}', 'completed', now(), now())"
        )
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, started_at, heartbeat_at) "
            "VALUES (gen_random_uuid(), 'box', 1, 2, '[]', %s, now())",
            [INSTANT],
        )
    return ids


def test_every_admin_page_renders_with_local_times(admin_client: Client, zone: str) -> None:
    ids = write_rows()
    clock, abbreviation = LOCAL[zone]
    for url in (JOBS, FAILED, JOBS + "?status__exact=failed", JOBS + "?q=boom", DASHBOARD, reverse("admin:index")):
        response = admin_client.get(url)
        assert response.status_code == 200, url
    listing = admin_client.get(JOBS).content.decode()
    assert ">2025-01-15</time>" in listing  # a day of another year shows its date
    assert f'title="2025-01-15 {clock}.250000' in listing  # and its full local time on hover
    assert f'title="2025-01-15 {clock}.250000' in admin_client.get(FAILED).content.decode()
    for status, job_id in ids.items():
        page = admin_client.get(reverse("admin:axa_django_job_change", args=[job_id]))
        assert page.status_code == 200, status
        assert f"2025-01-15 {clock}.250 {abbreviation}" in page.content.decode(), status
    for view in ("history", "delete"):
        assert admin_client.get(reverse(f"admin:axa_django_job_{view}", args=[ids["failed"]])).status_code == 200
    board = admin_client.get(DASHBOARD)
    html = board.content.decode()
    assert f"2025-01-15 {clock}" in html  # the worker's start
    stats = board.context["stats"]
    assert sum(h.completed for h in stats.hours) == 1 and stats.counts["failed"] == 1
    assert "1 completed, 0 failed" in html


def test_times_of_today_show_the_local_clock(admin_client: Client, zone: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, started_at, finished_at) "
            "VALUES (gen_random_uuid(), 'tests.testapp.jobs.add', '{}', 'failed', now(), now()) RETURNING finished_at"
        )
        finished = cursor.fetchone()[0]
    local = timezone.localtime(finished) if timezone.is_aware(finished) else finished
    html = admin_client.get(FAILED).content.decode()
    assert f">{local:%H:%M:%S}</time>" in html


def test_format_helpers_take_naive_and_aware_times(zone: str) -> None:
    aware = datetime.datetime(2025, 1, 15, 12, 0, 0, 250000, tzinfo=datetime.UTC)
    clock, abbreviation = LOCAL[zone]
    # With USE_TZ = False, Django reads timestamptz as naive datetimes in TIME_ZONE.
    naive = timezone.make_naive(aware, timezone.get_default_timezone())
    for value in (aware, naive):
        assert job_admin.full_time(value) == f"2025-01-15 {clock}.250 {abbreviation}"
        assert f'title="2025-01-15 {clock}.250000' in job_admin.format_time(value)
    hours = [dashboard.Hour(naive, 1, 0), dashboard.Hour(aware, 0, 1)]
    svg = str(dashboard.chart_svg(hours))
    assert f"2025-01-15 {clock[:2]}:00: 1 completed, 0 failed" in svg
    assert f"2025-01-15 {clock[:2]}:00: 0 completed, 1 failed" in svg


def test_retry_and_cancel_buttons_work(admin_client: Client, zone: str) -> None:
    ids = write_rows()
    for view, status, after in (("retry", "failed", "queued"), ("cancel", "queued", "cancelled")):
        response = admin_client.post(reverse(f"admin:axa_django_job_{view}", args=[ids[status]]), follow=True)
        assert response.status_code == 200, view
        assert Job.objects.get(pk=ids[status]).status == after


@pytest.mark.django_db(transaction=True)
def test_a_naive_run_at_is_read_in_time_zone_when_use_tz_is_false() -> None:
    from tests.testapp import jobs

    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        job = jobs.add.using(run_at=datetime.datetime(2030, 1, 15, 7, 0)).perform_later(1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_at = '2030-01-15 12:00:00+00' FROM axa_queue WHERE id = %s", [job.pk])
        assert cursor.fetchone() == (True,)
    with override_settings(USE_TZ=True), pytest.raises(ValueError, match="timezone-aware"):
        jobs.add.using(run_at=datetime.datetime(2030, 1, 15, 7, 0))


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_jobs_and_periodic_jobs_with_use_tz_false(workers) -> None:
    from tests.conftest import wait_for
    from tests.testapp import jobs

    env = workers.env(AXA_TEST_USE_TZ="0", AXA_TEST_TIME_ZONE="America/New_York", AXA_TEST_CRON="1")
    proc = workers.start("--concurrency", "2", env=env)
    job = jobs.add.using(delay=datetime.timedelta(seconds=1)).perform_later(2, 3)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="the delayed job")
    wait_for(
        lambda: Job.objects.filter(name="tests.every_second", status="completed").count() >= 2,
        what="two periodic ticks",
    )
    keys = set(Job.objects.filter(name="tests.every_second").values_list("unique_key", flat=True))
    ticks = sorted(datetime.datetime.fromisoformat(key.removeprefix("cron:")) for key in keys)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert abs((ticks[-1] - now).total_seconds()) < 60, (ticks, now)  # scheduled on the right clock
    proc.terminate()
    assert proc.wait(timeout=30) == 0, proc.stdout.read()
