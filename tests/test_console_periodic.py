"""The periodic jobs page: each cron entry, its last and next run, the workers that run it, enable and disable.

Figures are checked against SQL of the test's own; a real runworker shows that a disabled
entry is not enqueued while an enabled one is.
"""

from __future__ import annotations

import datetime
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from axa_django import Job, background_job, cron, registry
from axa_django.admin.display import full_time
from axa_django.models import Schedule, Worker
from axa_django.registry import JobFunction
from tests.conftest import Workers, wait_for
from tests.test_admin import user_with

PAGE = reverse("admin:axa_django_periodicjob_changelist")
TOGGLE = reverse("admin:axa_django_periodicjob_toggle")
HOSTILE = "tests.console.<b>&amp;"


def nightly() -> None: ...


def every_five() -> None: ...


def hourly() -> None: ...


@pytest.fixture
def periodic() -> Iterator[dict[str, JobFunction[Any, Any]]]:
    """Periodic jobs registered for one test only, so no other test's worker schedules them."""
    made = {
        "nightly": background_job(name="tests.console.nightly", cron="30 2 * * *", queue="reports")(nightly),
        "five": background_job(name="tests.console.every_five", cron="*/5 * * * *")(every_five),
        "hostile": background_job(name=HOSTILE, cron="@hourly")(hourly),
    }
    yield made
    for job in made.values():
        registry.registry.pop(job.name, None)


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def row_of(html: str, name: str) -> str:
    found = re.search(rf'<tr data-name="{re.escape(name)}".*?</tr>', html, re.S)
    assert found, f"no row for {name}"
    return found[0]


def cell(row: str, css: str) -> str:
    found = re.search(rf'<td class="{css}">(.*?)</td>', row, re.S)
    assert found, css
    return re.sub(r"\s+", " ", found[1]).strip()


LIVE_FOR = """
SELECT string_agg(hostname || ' pid ' || pid, ', ' ORDER BY started_at, id) FROM axa_worker
WHERE heartbeat_at >= now() - make_interval(secs => lease_seconds)
  AND names ? %s AND (queues = '[]'::jsonb OR queues ? %s)
"""


@pytest.mark.django_db
def test_each_entry_shows_its_schedule_in_words_last_run_next_run_and_live_workers(
    admin_client: Client, periodic: dict[str, JobFunction[Any, Any]]
) -> None:
    nightly, five = periodic["nightly"], periodic["five"]
    last = Job.objects.create(name=nightly.name, args={}, status="completed", attempts=1, unique_key="cron:x")
    Job.objects.filter(pk=last.pk).update(finished_at=last.created_at + datetime.timedelta(seconds=2))
    Schedule.objects.create(name=nightly.name, last_run=last.created_at, last_job_id=last.pk)
    Worker.objects.create(hostname="w<1>", pid=11, concurrency=2, names=[nightly.name, five.name], queues=["reports"])
    Worker.objects.create(hostname="w2", pid=12, concurrency=2, names=[five.name], queues=[])
    dead = Worker.objects.create(hostname="dead", pid=13, concurrency=2, names=[five.name, nightly.name], queues=[])
    Worker.objects.filter(pk=dead.pk).update(heartbeat_at=last.created_at - datetime.timedelta(hours=1))
    before = sql("SELECT statement_timestamp()")[0][0]
    html = admin_client.get(PAGE).content.decode()
    after = sql("SELECT statement_timestamp()")[0][0]

    row = row_of(html, nightly.name)
    assert (
        cell(row, "axa-words") == "daily at 02:30"
        and "<td>reports</td>" in row
        and f"<td>{cron.timezone().key}</td>" in row
    )
    finished, status = sql("SELECT finished_at, status FROM axa_queue WHERE id = %s", last.pk)[0]
    last_cell = cell(row, "axa-last")
    assert f'href="{reverse("admin:axa_django_job_change", args=[last.pk])}"' in last_cell
    assert f"axa-{status}" in last_cell and full_time(finished) in last_cell
    expected = {f"{cron.next_runs(nightly, 1, after=at)[0]:%Y-%m-%d %H:%M:%S}" for at in (before, after)}
    assert cell(row, "axa-next").split(" (in ")[0] in expected
    # Live workers: the SQL's list, escaped: w<1> covers queue "reports", the dead one is left out.
    (live,) = sql(LIVE_FOR, nightly.name, "reports")[0]
    assert live == "w<1> pid 11" and cell(row, "axa-workers") == "w&lt;1&gt; pid 11"

    row = row_of(html, five.name)
    assert cell(row, "axa-words") == "every 5 minutes" and cell(row, "axa-last") == "not yet"
    (live,) = sql(LIVE_FOR, five.name, "default")[0]
    assert live == "w2 pid 12" and cell(row, "axa-workers") == "w2 pid 12"  # w<1> claims only "reports"
    hostile = row_of(html, "tests.console.&lt;b&gt;&amp;amp;")
    assert cell(hostile, "axa-words") == "hourly at :00" and cell(hostile, "axa-workers").endswith("none</span>")
    assert "<b>" not in html.split('id="axa-periodic"')[1]
    assert f"{len(cron.scheduled_jobs())} periodic jobs registered" in html and len(cron.scheduled_jobs()) >= 3


@pytest.mark.django_db
def test_disable_and_enable_from_the_page_logged_and_in_the_admin_history(
    periodic: dict[str, JobFunction[Any, Any]], caplog: Any
) -> None:
    five = periodic["five"]
    client = user_with("view_job", "change_schedule")
    assert 'name="enabled" value="off"' in row_of(client.get(PAGE).content.decode(), five.name)
    with caplog.at_level(logging.INFO, logger="axa_django"):
        response = client.post(TOGGLE, {"name": five.name, "enabled": "off"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        f"Periodic job {five.name} disabled: no worker enqueues it until it is enabled again."
    ]
    assert sql("SELECT enabled FROM axa_schedule WHERE name = %s", five.name) == [(False,)]
    row = row_of(response.content.decode(), five.name)
    assert cell(row, "axa-enabled") == "no" and cell(row, "axa-next") == "- (disabled)"
    names = [job.name for job in cron.scheduled_jobs()]
    (off,) = sql("SELECT count(*) FROM axa_schedule WHERE NOT enabled AND name = ANY(%s)", names)[0]
    assert off == 1 and f"{len(names)} periodic jobs registered, {off} disabled." in response.content.decode()
    assert 'name="enabled" value="on"' in row
    assert [r.getMessage() for r in caplog.records if "periodic job" in r.getMessage()] == [
        f"{response.context['user']} disabled periodic job {five.name} (1 schedule changed)"
    ]
    entry = LogEntry.objects.get(object_id=five.name)
    assert entry.get_change_message().startswith("Disabled: ")
    # Twice: nothing changes, and the page says so.
    again = client.post(TOGGLE, {"name": five.name, "enabled": "off"}, follow=True)
    assert "was already disabled; nothing changed" in str(next(iter(again.context["messages"])))
    assert LogEntry.objects.filter(object_id=five.name).count() == 1
    # Enabled again: its last occurrence moves to the latest due, so none missed is caught up.
    (now,) = sql("SELECT statement_timestamp()")[0]
    client.post(TOGGLE, {"name": five.name, "enabled": "on"})
    enabled, last_run = sql("SELECT enabled, last_run FROM axa_schedule WHERE name = %s", five.name)[0]
    # Read through Django's connection, times are naive (in TIME_ZONE) with USE_TZ = False.
    assert enabled and cron.aware(last_run) >= cron.due(five, cron.aware(now))
    assert LogEntry.objects.filter(object_id=five.name).count() == 2


@pytest.mark.django_db
def test_the_toggle_needs_its_permission_a_post_and_a_registered_periodic_job(
    periodic: dict[str, JobFunction[Any, Any]],
) -> None:
    five = periodic["five"]
    viewer = user_with("view_job")
    html = viewer.get(PAGE).content.decode()
    assert five.name in html and 'name="enabled"' not in html
    assert viewer.post(TOGGLE, {"name": five.name, "enabled": "off"}).status_code == 403
    assert user_with("retry_job").get(PAGE).status_code == 403
    assert user_with("view_schedule").get(PAGE).status_code == 200
    allowed = user_with("view_job", "change_schedule")
    assert allowed.get(TOGGLE).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(pk=allowed.session["_auth_user_id"]))
    assert strict.post(TOGGLE, {"name": five.name, "enabled": "off"}).status_code == 403  # no CSRF token
    assert allowed.post(TOGGLE, {"name": five.name + "\x00", "enabled": "off"}).status_code == 400
    assert allowed.get(PAGE + "?q=%00").status_code == 400
    for data, said in (
        ({"name": "tests.testapp.jobs.add", "enabled": "off"}, "No periodic job named 'tests.testapp.jobs.add'"),
        ({"name": "nope", "enabled": "off"}, "No periodic job named 'nope'"),
        ({"name": five.name, "enabled": "maybe"}, "Say enabled=on or off, not 'maybe'"),
        ({}, "No periodic job named ''"),
    ):
        response = allowed.post(TOGGLE, data, follow=True)
        assert response.status_code == 200 and said in str(next(iter(response.context["messages"])))
    assert not Schedule.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
def test_a_disabled_entry_is_skipped_and_enabled_again_catches_up_nothing(
    periodic: dict[str, JobFunction[Any, Any]],
) -> None:
    five, nightly = periodic["five"], periodic["nightly"]
    at = datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.UTC)
    names = [five.name, nightly.name]
    cron.schedule(at, names=names)  # first sight: recorded, not run
    assert cron.set_enabled(five, False) and not cron.set_enabled(five, False)
    assert [j.name for j in cron.schedule(at + datetime.timedelta(minutes=5), names=names)] == []
    assert cron.aware(Schedule.objects.get(name=five.name).last_run) == at  # stays while disabled
    # Enabled long after: the next schedule enqueues only occurrences after the enable.
    assert cron.set_enabled(five, True)
    now = cron.aware(sql("SELECT statement_timestamp()")[0][0])  # naive with USE_TZ = False
    later = cron.next_runs(five, 1, after=now)[0] + datetime.timedelta(seconds=1)
    written = cron.schedule(later, names=[five.name])
    assert [j.unique_key for j in written] == [cron.unique_key(cron.due(five, later))]
    assert Schedule.objects.get(name=five.name).last_job_id == written[0].pk
    with pytest.raises(ValueError, match="not a periodic job"):
        cron.set_enabled(registry.get("tests.testapp.jobs.add"), False)


def kept() -> None: ...


def switched_off() -> None: ...


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_enqueues_the_enabled_entry_and_not_the_disabled_one(workers: Workers) -> None:
    # As tests/testapp/console_cron_jobs.py defines them for the worker (AXA_TEST_CONSOLE_CRON).
    on = background_job(name="tests.console.kept", cron="* * * * * *")(kept)
    off = background_job(name="tests.console.switched_off", cron="* * * * * *")(switched_off)
    try:
        client = user_with("view_job", "change_schedule")
        client.post(TOGGLE, {"name": off.name, "enabled": "off"})
        assert sql("SELECT enabled FROM axa_schedule WHERE name = %s", off.name) == [(False,)]
        workers.start("--concurrency", "2", env=workers.env(AXA_TEST_CONSOLE_CRON="1"))
        count = "SELECT count(*) FROM axa_queue WHERE name = %s"
        wait_for(lambda: sql(count, on.name)[0][0] >= 2, 60, "two occurrences of the enabled entry")
        assert sql(count, off.name) == [(0,)]
        assert sql("SELECT last_job_id IS NULL, enabled FROM axa_schedule WHERE name = %s", off.name) == [(True, False)]
        (last_job,) = sql("SELECT last_job_id FROM axa_schedule WHERE name = %s", on.name)[0]
        assert sql("SELECT name FROM axa_queue WHERE id = %s", last_job) == [(on.name,)]
    finally:
        registry.registry.pop(on.name, None)
        registry.registry.pop(off.name, None)


@pytest.mark.django_db
def test_with_use_tz_false_the_page_reads_times_in_time_zone(
    admin_client: Client, periodic: dict[str, JobFunction[Any, Any]]
) -> None:
    nightly = periodic["nightly"]
    last = Job.objects.create(name=nightly.name, args={}, status="completed")
    sql("UPDATE axa_queue SET finished_at = '2025-01-15 12:00:01.25+00' WHERE id = %s", last.pk)
    sql("INSERT INTO axa_schedule (name, last_run, last_job_id) VALUES (%s, now(), %s)", nightly.name, last.pk)
    for use_tz in (True, False):
        with override_settings(USE_TZ=use_tz, TIME_ZONE="America/New_York"):
            row = row_of(admin_client.get(PAGE).content.decode(), nightly.name)
        assert "<td>America/New_York</td>" in row, use_tz
        assert cell(row, "axa-last").endswith("2025-01-15 07:00:01.250 EST"), use_tz
        assert re.fullmatch(r"\d{4}-\d\d-\d\d 02:30:00 \(in .*\)", cell(row, "axa-next")), use_tz
