"""Admin polish (issue 12): NUL in queries, "about" counts, retry confirmation, id search, dashboard figures, layout."""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any

import django
import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from axa_django import unhandled
from axa_django.admin.display import short_error, thousands
from axa_django.admin.lists import ID_MATCHES
from axa_django.admin.pagination import EstimatedCountPaginator
from axa_django.models import Job, Worker
from tests.test_admin import (
    DASHBOARD,
    FAILED,
    FAILED_RETRY_MATCHING,
    JOBS,
    RETRY_MATCHING,
    change_url,
    make_job,
)
from tests.testapp import jobs as testapp_jobs

pytestmark = pytest.mark.django_db

NOW = timezone.now()


# A NUL byte in any filter, search or list parameter: a 400, never a 500.

NUL_QUERIES = [
    (JOBS, "name=%00"),
    (JOBS, "status__exact=%00"),
    (JOBS, "queue=%00"),
    (JOBS, "q=%00"),
    (JOBS, "q=ab%00cd"),
    (JOBS, "created_at__gte=%00"),
    (JOBS, "created_at__lt=%00"),
    (JOBS, "o=%00"),
    (JOBS, "p=%00"),
    (JOBS, "%00=1"),
    (FAILED, "name=%00"),
    (FAILED, "queue=%00"),
    (FAILED, "q=%00"),
    (FAILED, "finished_at__gte=%00"),
    (RETRY_MATCHING, "name=%00"),
    (RETRY_MATCHING, "q=%00"),
    (FAILED_RETRY_MATCHING, "status__exact=%00"),
]


@pytest.mark.parametrize(("url", "query"), NUL_QUERIES)
def test_a_nul_in_a_filter_or_search_is_a_400(admin_client: Client, url: str, query: str) -> None:
    failed = make_job("failed")
    response = admin_client.get(f"{url}?{query}")
    assert response.status_code == 400
    assert "NUL" in response.content.decode()
    confirmed = admin_client.post(f"{url}?{query}", {"post": "yes"})
    assert confirmed.status_code == 400
    assert Job.objects.get(pk=failed.pk).status == "failed"


def test_a_nul_in_a_selected_action_row_is_a_400(admin_client: Client) -> None:
    job = make_job("failed")
    data = {"action": "retry_selected", ACTION_CHECKBOX_NAME: [str(job.pk), "\x00"], "index": "0"}
    assert admin_client.post(JOBS, data).status_code == 400
    assert Job.objects.get(pk=job.pk).status == "failed"


# Counts past the exact-count cap say "about", in the search bar and the paginator alike.


def test_an_estimated_count_says_about_in_the_search_bar_and_the_paginator(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 5)
    for _ in range(12):
        make_job("completed")
    response = admin_client.get(JOBS, {"q": "testapp"})
    assert response.context["cl"].paginator.estimated is True
    html = response.content.decode()
    bar = re.search(r'id="axa-result-count">([^<]*)<', html)
    assert bar and re.fullmatch(r"about [\d,]+ results \(", bar.group(1).strip()), bar
    assert re.search(r"about [\d,]+ jobs", html)
    exact = admin_client.get(JOBS, {"q": "testapp", "status__exact": "failed"}).content.decode()
    assert re.search(r'id="axa-result-count">0 results \(', exact)


def test_counts_carry_thousands_separators() -> None:
    assert thousands(300000) == "300,000" and thousands(999) == "999" and thousands(0) == "0"


# An id-shaped search reads ids only.


def test_an_id_prefix_searches_ids_only(admin_client: Client) -> None:
    target = make_job()
    prefix = str(target.pk)[:28]  # past the time the ids begin with (axa_django.ids)
    decoy = make_job("failed", args={"note": prefix}, error=f"ValueError: {prefix}")

    def found(term: str) -> set[uuid.UUID]:
        with CaptureQueriesContext(connection) as queries:
            listed = {job.pk for job in admin_client.get(JOBS, {"q": term}).context["cl"].result_list}
        assert not any("LIKE" in q["sql"].upper() for q in queries.captured_queries), term
        return listed

    assert found(prefix) == {target.pk}
    assert found(target.pk.hex[:24]) == {target.pk}  # without its dashes
    assert found(prefix.upper()) == {target.pk}
    # Eight characters are the time to about a minute: the jobs made then.
    assert found(prefix[:8]) == {job.pk for job in (target, decoy) if job.pk.hex[:8] == prefix[:8]}
    assert found(str(target.pk).upper()) == {target.pk}
    text = {job.pk for job in admin_client.get(JOBS, {"q": "note"}).context["cl"].result_list}
    assert text == {decoy.pk}


def test_an_id_prefix_lists_at_most_the_newest_matches_read_by_the_primary_key(admin_client: Client) -> None:
    batch = testapp_jobs.add.perform_later_many([((i, i), {}) for i in range(ID_MATCHES + 50)])
    prefix = batch[0].pk.hex[:8]
    with CaptureQueriesContext(connection) as queries:
        changelist = admin_client.get(JOBS, {"q": prefix}).context["cl"]
    # A batch's ids ascend and share their start: the newest ID_MATCHES of them (a list page shows 50).
    newest = sorted((job.pk for job in batch if job.pk.hex.startswith(prefix)), reverse=True)
    assert changelist.result_count == min(len(newest), ID_MATCHES) == ID_MATCHES
    assert {job.pk for job in changelist.result_list} == set(newest[:50])
    assert any("ORDER BY" in q["sql"] and f"LIMIT {ID_MATCHES}" in q["sql"] for q in queries.captured_queries)


# The dashboard: separators and the names no live worker handles.


def test_dashboard_numbers_carry_thousands_separators(admin_client: Client) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, started_at, finished_at) "
            "SELECT gen_random_uuid(), 'tests.testapp.jobs.add', '{}', 'completed', now(), now() "
            "FROM generate_series(1, 1234)"
        )
    html = admin_client.get(DASHBOARD).content.decode()
    assert '<span class="axa-number">1,234</span>' in html
    assert "completed: 1,234" in html


def live_worker(names: list[str], backends: list[str] | None = None, *, stale: bool = False) -> Worker:
    worker = Worker.objects.create(hostname="box", pid=1, concurrency=1, names=names, backends=backends or [])
    if stale:
        Worker.objects.filter(pk=worker.pk).update(heartbeat_at=NOW - datetime.timedelta(hours=1))
    return worker


def test_dashboard_lists_ready_names_and_backends_no_live_worker_handles(admin_client: Client) -> None:
    def ready_job(**fields: Any) -> Job:
        # Ready by the database clock, which stands at this test transaction's start.
        return make_job(**{"run_at": NOW - datetime.timedelta(minutes=1), **fields})

    live_worker(["tests.testapp.jobs.add"], ["default"])
    live_worker(["Nobody.Handles", "Ghost.Backend.Task"], ["ghost"], stale=True)  # its lease ran out
    ready_job(name="tests.testapp.jobs.add")
    for _ in range(3):
        ready_job(name="Nobody.Handles")
    ready_job(name="Later.Job", run_at=NOW + datetime.timedelta(hours=1))  # not ready yet
    ready_job(name="Nobody.Handles", run_at=NOW + datetime.timedelta(hours=1))
    ready_job(name="tests.testapp.jobs.add", backend="ghost")  # a task row: judged by its backend
    ready_job(name="some.task", backend="default")
    found = unhandled.find()
    assert found == [
        unhandled.Unhandled("Nobody.Handles", None, "default", 3),
        unhandled.Unhandled(None, "ghost", "default", 1),
    ]
    html = admin_client.get(DASHBOARD).content.decode()
    table = html[html.index('id="axa-unhandled"') :]
    table = table[: table.index("</table>")]
    assert f'href="{JOBS}?status__exact=queued&amp;name=Nobody.Handles">Nobody.Handles</a>' in table
    assert "task backend <code>ghost</code>" in table
    assert "Later.Job" not in table and "tests.testapp.jobs.add" not in table and "some.task" not in table


def test_dashboard_without_unhandled_names_shows_no_table(admin_client: Client) -> None:
    live_worker(["tests.testapp.jobs.add"])
    make_job(name="tests.testapp.jobs.add", run_at=NOW - datetime.timedelta(minutes=1))
    assert 'id="axa-unhandled"' not in admin_client.get(DASHBOARD).content.decode()


# Layout: short errors in lists, the failure first, neutral booleans, breadcrumbs per Django version.


def test_long_errors_are_cut_in_lists_and_whole_on_the_job_page(admin_client: Client) -> None:
    long = "ValueError: " + "x" * 300
    job = make_job("failed", errors=[], error=long)
    html = admin_client.get(FAILED).content.decode()
    cell = re.search(r'<span class="axa-error" title="([^"]*)">([^<]*)</span>', html)
    assert cell and cell.group(1) == long
    assert len(cell.group(2)) <= 100 and cell.group(2).endswith("\u2026")
    assert long in admin_client.get(change_url(job)).content.decode()
    assert short_error("short") == "short"


def test_a_failed_jobs_page_shows_the_failure_before_times_and_result(admin_client: Client) -> None:
    job = make_job("failed")
    html = admin_client.get(change_url(job)).content.decode()
    failure = html.index('id="axa-attempts"')
    assert html.index("field-status_marker") < failure < html.index(">Times<") < html.index(">Result<")
    assert failure < html.index("field-unique_key") and failure < html.index("field-backend")
    done = admin_client.get(change_url(make_job("completed"))).content.decode()
    assert done.index(">Result<") < done.index('id="axa-attempts"')  # nothing failed: the result comes first


def test_booleans_on_the_job_page_read_neutrally(admin_client: Client) -> None:
    html = admin_client.get(change_url(make_job("failed"))).content.decode()
    assert "icon-no.svg" not in html and "icon-yes.svg" not in html
    cell = re.search(r'field-cancel_requested_shown.*?<div class="readonly">([^<]*)</div>', html, re.S)
    assert cell and cell.group(1).strip() == "no"


@pytest.mark.parametrize("url", [DASHBOARD, reverse("admin:axa_django_bulkoperation_start", args=["job", "retry"])])
def test_breadcrumbs_use_the_markup_this_django_styles(admin_client: Client, url: str) -> None:
    html = admin_client.get(url).content.decode()
    if django.VERSION >= (6, 0):
        assert '<ol class="breadcrumbs">' in html and '<div class="breadcrumbs">' not in html
        assert re.search(r'<li aria-current="page">(Dashboard|Retry all matching)</li>', html)
    else:
        assert '<div class="breadcrumbs">' in html and '<ol class="breadcrumbs">' not in html
