"""The job admin through Django's test client: every view, action and permission, on real PostgreSQL."""

from __future__ import annotations

import datetime
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import psycopg
import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission, User
from django.db import connection, connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from axa_django.admin import error_line, format_duration
from axa_django.admin.pagination import EstimatedCountPaginator
from axa_django.models import FinishedHour, Job, Worker
from axa_django.ops import dashboard, fleetstats
from axa_django.worker import connect
from tests.conftest import database_url, wait_for
from tests.testapp.admin_jobs import refresh_account

if TYPE_CHECKING:
    from axa_django.models import RetryResult

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:axa_django_job_changelist")
FAILED = reverse("admin:axa_django_failedjob_changelist")
DASHBOARD = reverse("admin:axa_django_queuedashboard_changelist")
RETRY_MATCHING = reverse("admin:axa_django_job_retry_matching")
FAILED_RETRY_MATCHING = reverse("admin:axa_django_failedjob_retry_matching")
TRACEBACK = 'Traceback (most recent call last):\n  File "jobs.py", line 3, in boom\nValueError: boom'
NOW = timezone.now()


def make_job(status: str = "queued", **fields: Any) -> Job:
    """Write one row as a worker would have left it."""
    fields.setdefault("name", "tests.testapp.jobs.add")
    fields.setdefault("args", {"a": 1, "b": 2})
    if status in ("completed", "failed", "cancelled"):
        fields.setdefault("started_at", NOW - datetime.timedelta(seconds=3))
        fields.setdefault("finished_at", NOW - datetime.timedelta(seconds=1))
        fields.setdefault("attempts", 1)
    if status == "failed":
        fields.setdefault("error", TRACEBACK)
        fields.setdefault(
            "errors",
            [
                {
                    "attempt": 1,
                    "at": "2026-01-01T00:00:00Z",
                    "worker": None,
                    "type": "builtins.ValueError",
                    "message": "boom",
                    "traceback": TRACEBACK,
                }
            ],
        )
    job = Job.objects.create(status=status, **fields)
    job.refresh_from_db()
    return job


def change_url(job: Job) -> str:
    return reverse("admin:axa_django_job_change", args=[job.pk])


def retry_url(job: Job) -> str:
    return reverse("admin:axa_django_job_retry", args=[job.pk])


def cancel_url(job: Job) -> str:
    return reverse("admin:axa_django_job_cancel", args=[job.pk])


def user_with(*codenames: str) -> Client:
    """A logged-in staff client holding exactly these axa_django permissions."""
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:8]}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="axa_django", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def action(client: Client, url: str, name: str, jobs: list[Job], **extra: str) -> Any:
    data = {"action": name, ACTION_CHECKBOX_NAME: [str(j.pk) for j in jobs], "index": "0", **extra}
    return client.post(url, data, follow=True)


# The index and the lists.


def test_index_links_jobs_failed_jobs_and_dashboard(admin_client: Client) -> None:
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert f'href="{JOBS}"' in html
    assert f'href="{FAILED}"' in html and "Failed jobs" in html
    assert f'href="{DASHBOARD}"' in html and "Dashboard" in html


def test_job_list_shows_columns_badges_and_the_error_line(admin_client: Client) -> None:
    jobs = {status: make_job(status) for status in Job.Status.values}
    response = admin_client.get(JOBS)
    html = response.content.decode()
    for status, job in jobs.items():
        assert str(job.pk) in html
        assert f'class="axa-badge axa-{status}"' in html
    assert "ValueError: boom" in html
    assert "2.0 s" in html  # duration of the finished rows
    for column in ("attempts", "run at", "started", "finished", "duration", "error"):
        assert f">{column.capitalize()}<" in html or f">{column}<" in html.lower()


def test_job_list_filters_by_status_name_queue_and_date(admin_client: Client) -> None:
    failed = make_job("failed", name="CountWorker", args={"fail": True})
    done = make_job("completed", queue="mail")
    old = make_job("completed")
    Job.objects.filter(pk=old.pk).update(created_at=NOW - datetime.timedelta(days=30))

    def listed(query: str) -> set[uuid.UUID]:
        response = admin_client.get(JOBS + query)
        assert response.status_code == 200
        return {job.pk for job in response.context["cl"].result_list}

    assert listed("?status__exact=failed") == {failed.pk}
    assert listed("?name=CountWorker") == {failed.pk}
    assert listed("?queue=mail") == {done.pk}
    since = urlencode({"created_at__gte": (NOW - datetime.timedelta(days=7)).isoformat()})
    assert listed(f"?{since}") == {failed.pk, done.pk}
    html = admin_client.get(JOBS).content.decode()
    assert "?name=CountWorker" in html  # registered names are the filter's choices


def test_search_by_id_prefix_name_args_and_error(admin_client: Client) -> None:
    a = make_job(args={"email": "ada@example.com"})
    b = make_job("failed", name="CountWorker", args={"fail": True}, error="ValueError: disk quota exceeded")

    def found(term: str) -> set[uuid.UUID]:
        return {job.pk for job in admin_client.get(JOBS, {"q": term}).context["cl"].result_list}

    assert found(str(a.pk)) == {a.pk}
    assert found(str(a.pk)[:28]) == {a.pk}
    assert found(str(a.pk)[:8]) >= {a.pk}  # the jobs of about a minute: ids begin with their time
    assert found("countworker") == {b.pk}
    assert found("ada@example") == {a.pk}
    assert found("quota") == {b.pk}
    assert found("nothing-like-this") == set()


def test_lists_never_count_the_whole_table(admin_client: Client) -> None:
    for _ in range(3):
        make_job("completed")
    with CaptureQueriesContext(connection) as queries:
        for url in (JOBS, FAILED, JOBS + "?status__exact=completed"):
            assert admin_client.get(url).status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts, "expected capped counts"
    assert all("LIMIT" in sql.upper() for sql in counts), counts


def test_past_the_cap_the_count_is_the_planners_estimate(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 5)
    for _ in range(12):
        make_job("completed")
    response = admin_client.get(JOBS)
    assert response.context["cl"].paginator.estimated is True
    assert response.context["cl"].result_count > 5
    assert re.search(r"about [\d,]+ jobs", response.content.decode())
    small = admin_client.get(JOBS + "?status__exact=failed")
    assert small.context["cl"].paginator.estimated is False
    assert small.context["cl"].result_count == 0


def test_failed_jobs_page_lists_only_failed_most_recent_first(admin_client: Client) -> None:
    older = make_job("failed", finished_at=NOW - datetime.timedelta(hours=2))
    newer = make_job("failed", finished_at=NOW - datetime.timedelta(minutes=1), error="KeyError: 'x'\nmore", errors=[])
    make_job("completed")
    make_job("queued")
    response = admin_client.get(FAILED)
    assert [job.pk for job in response.context["cl"].result_list] == [newer.pk, older.pk]
    html = response.content.decode()
    assert "ValueError: boom" in html  # from the attempt history
    assert "KeyError: &#x27;x&#x27;" in html and "more" not in html  # the error column's first line only


def test_a_job_whose_workers_died_shows_its_losses_beside_its_attempts(admin_client: Client) -> None:
    lost = make_job("failed", attempts=1, losses=3, max_attempts=2)
    plain = make_job("failed", attempts=2)
    html = admin_client.get(FAILED).content.decode()
    assert "1/2 (worker lost 3x)" in html
    assert admin_client.get(change_url(lost)).content.decode().count("1/2 (worker lost 3x)") == 1
    assert "(worker lost" not in admin_client.get(change_url(plain)).content.decode()


def test_a_failed_job_link_opens_the_job_detail(admin_client: Client) -> None:
    job = make_job("failed")
    response = admin_client.get(reverse("admin:axa_django_failedjob_change", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == change_url(job)


def test_the_failed_lists_row_links_open_the_job_page_without_a_redirect(admin_client: Client) -> None:
    job = make_job("failed")
    for query in ("", "?name=tests.testapp.jobs.add"):
        html = admin_client.get(FAILED + query).content.decode()
        [link] = re.findall(r'<th class="field-id_shown"><a href="([^"]+)"', html)
        assert link.split("?")[0] == change_url(job), link
        response = admin_client.get(link.replace("&amp;", "&"))
        assert response.status_code == 200 and str(job.pk) in response.content.decode()


def test_the_waiting_badge_uses_a_glyph_common_fonts_have(admin_client: Client) -> None:
    make_job("waiting")
    html = admin_client.get(JOBS).content.decode()
    # U+29D6 (an hourglass) shows as an empty box in many fonts; an ellipsis is in all of them.
    assert '<span class="axa-badge axa-waiting" title="waiting">\u2026 Waiting</span>' in html
    assert "\u29d6" not in html


# The detail page.


def test_detail_shows_args_every_attempt_times_and_worker(admin_client: Client) -> None:
    worker = uuid.uuid4()
    job = make_job(
        "failed",
        args={"user": {"id": 7, "tags": ["a", "b"]}},
        worker_id=worker,
        attempts=2,
        max_attempts=2,
        errors=[
            {
                "attempt": 1,
                "at": "t1",
                "worker": str(worker),
                "type": "builtins.OSError",
                "message": "first",
                "traceback": "TB one",
            },
            {
                "attempt": 2,
                "at": "t2",
                "worker": str(worker),
                "type": "builtins.ValueError",
                "message": "second",
                "traceback": "TB two",
            },
        ],
    )
    html = admin_client.get(change_url(job)).content.decode()
    assert "&quot;user&quot;: {\n    &quot;id&quot;: 7," in html  # indented JSON
    assert "TB one" in html and "TB two" in html
    assert html.index("TB two") < html.index("TB one")  # latest attempt first
    assert "Attempt 1: builtins.OSError" in html and "Attempt 2: builtins.ValueError" in html
    assert str(worker) in html
    shown = timezone.localtime(job.created_at) if timezone.is_aware(job.created_at) else job.created_at  # USE_TZ off
    assert shown.strftime("%Y-%m-%d %H:%M:%S.") in html
    assert "2/2" in html
    assert 'id="axa-retry"' in html and 'id="axa-delete"' in html
    assert 'id="axa-cancel"' not in html


def test_detail_of_a_bare_error_shows_the_error_column(admin_client: Client) -> None:
    job = make_job("failed", errors=[], error="Rust says no\nsecond line")
    html = admin_client.get(change_url(job)).content.decode()
    assert "Rust says no\nsecond line" in html


def test_detail_buttons_follow_the_status(admin_client: Client) -> None:
    queued = admin_client.get(change_url(make_job("queued"))).content.decode()
    assert 'id="axa-cancel"' in queued and 'id="axa-retry"' not in queued
    done = admin_client.get(change_url(make_job("completed"))).content.decode()
    assert 'id="axa-cancel"' not in done and 'id="axa-retry"' not in done and 'id="axa-delete"' in done
    assert admin_client.get(reverse("admin:axa_django_job_change", args=["not-a-uuid"])).status_code == 302


def test_script_in_a_row_shows_as_text_everywhere(admin_client: Client) -> None:
    evil = "<script>alert(1)</script>"
    job = make_job(
        "failed",
        name=f"x{evil}",
        args={"html": evil},
        error=evil,
        errors=[{"attempt": 1, "at": evil, "worker": evil, "type": evil, "message": evil, "traceback": evil}],
    )
    Worker.objects.create(hostname=evil, pid=1, concurrency=1, queues=[evil])
    for url in (JOBS, FAILED, change_url(job), DASHBOARD, JOBS + "?q=%3Cscript"):
        html = admin_client.get(url).content.decode()
        assert "<script>alert(1)" not in html, url
        assert "&lt;script&gt;alert(1)" in html, url


# Buttons: retry and cancel one job.


def test_retry_button_queues_a_failed_job_now(admin_client: Client) -> None:
    job = make_job("failed", attempts=3, losses=3, worker_id=uuid.uuid4())
    response = admin_client.post(retry_url(job), follow=True)
    assert response.redirect_chain[-1][0] == change_url(job)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.losses, job.worker_id, job.finished_at) == ("queued", 0, 0, None, None)
    assert job.errors  # history is kept
    assert any("queued to run again" in m for m in messages_of(response))
    history = admin_client.get(reverse("admin:axa_django_job_history", args=[job.pk])).content.decode()
    assert "Retried: queued to run again." in history  # the button leaves an audit trail


def test_retry_skips_a_job_that_is_no_longer_failed(admin_client: Client) -> None:
    job = make_job("completed")
    response = admin_client.post(retry_url(job), follow=True)
    job.refresh_from_db()
    assert job.status == "completed"
    assert any("not retried: it is completed" in m for m in messages_of(response))


def test_cancel_button_cancels_queued_and_asks_running_to_stop(admin_client: Client) -> None:
    queued = make_job("queued")
    running = make_job("running", worker_id=uuid.uuid4())
    done = make_job("completed")
    assert "was cancelled" in messages_of(admin_client.post(cancel_url(queued), follow=True))[0]
    assert "asked to cancel" in messages_of(admin_client.post(cancel_url(running), follow=True))[0]
    assert "not cancelled: it is completed" in messages_of(admin_client.post(cancel_url(done), follow=True))[0]
    queued.refresh_from_db()
    running.refresh_from_db()
    done.refresh_from_db()
    assert queued.status == "cancelled" and queued.finished_at is not None
    assert running.status == "running" and running.cancel_requested
    assert done.status == "completed"


def test_buttons_refuse_get_and_unknown_jobs(admin_client: Client) -> None:
    job = make_job("failed")
    assert admin_client.get(retry_url(job)).status_code == 405
    assert admin_client.get(cancel_url(job)).status_code == 405
    assert admin_client.put(RETRY_MATCHING).status_code == 405
    missing = Job(pk=uuid.uuid4())
    assert admin_client.post(retry_url(missing)).status_code == 404
    assert admin_client.post(reverse("admin:axa_django_job_retry", args=["nope"])).status_code == 404
    job.refresh_from_db()
    assert job.status == "failed"


def test_delete_button_leads_to_the_delete_confirmation(admin_client: Client) -> None:
    job = make_job("completed")
    delete = reverse("admin:axa_django_job_delete", args=[job.pk])
    assert admin_client.get(delete).status_code == 200
    admin_client.post(delete, {"post": "yes"})
    assert not Job.objects.filter(pk=job.pk).exists()


# Actions.


def test_retry_selected_counts_and_skips_rows_not_failed(admin_client: Client) -> None:
    failed = [make_job("failed"), make_job("failed")]
    done = make_job("completed")
    response = action(admin_client, JOBS, "retry_selected", [*failed, done])
    assert "2 jobs queued to run again. Skipped 1 job not failed." in messages_of(response)
    assert set(Job.objects.filter(pk__in=[j.pk for j in failed]).values_list("status", flat=True)) == {"queued"}
    done.refresh_from_db()
    assert done.status == "completed"


def test_cancel_selected_counts_and_skips_finished_rows(admin_client: Client) -> None:
    queued, running, done = make_job("queued"), make_job("running"), make_job("completed")
    response = action(admin_client, JOBS, "cancel_selected", [queued, running, done])
    assert messages_of(response) == [
        "2 jobs cancelled (running ones asked to stop). Skipped 1 job already finished or cancelling."
    ]
    assert Job.objects.get(pk=queued.pk).status == "cancelled"
    assert Job.objects.get(pk=running.pk).cancel_requested
    assert Job.objects.get(pk=done.pk).status == "completed"


def test_delete_selected_deletes_after_confirmation(admin_client: Client) -> None:
    jobs = [make_job("completed"), make_job("failed")]
    confirm = action(admin_client, JOBS, "delete_selected", jobs)
    assert "Are you sure" in confirm.content.decode()
    assert Job.objects.count() == 2
    action(admin_client, JOBS, "delete_selected", jobs, post="yes")
    assert Job.objects.count() == 0


def test_retry_selected_on_the_failed_page(admin_client: Client) -> None:
    job = make_job("failed")
    response = action(admin_client, FAILED, "retry_selected", [job])
    assert messages_of(response) == ["1 job queued to run again."]
    assert Job.objects.get(pk=job.pk).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_retry_wakes_listening_workers() -> None:
    job = make_job("failed")
    listener = connect("default", "test listener")
    try:
        listener.execute("LISTEN axa_queue")
        assert Job.objects.filter(pk=job.pk).retry() == 1
        notes = list(listener.notifies(timeout=10, stop_after=1))
        # The wake-up; with it may come the row's own "ready:" (its run_at is the transaction's start).
        assert notes and {n.channel for n in notes} == {"axa_queue"}
        assert Job.objects.filter(pk=job.pk).retry() == 0  # no longer failed: guarded
    finally:
        listener.close()


# Permissions.


def test_view_only_user_sees_no_buttons_or_actions_and_posts_are_refused() -> None:
    client = user_with("view_job")
    job = make_job("failed")
    queued = make_job("queued")
    listing = client.get(JOBS)
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "retry_selected" not in html and "cancel_selected" not in html and "delete_selected" not in html
    assert 'id="axa-retry-matching"' not in html
    failed_page = client.get(FAILED).content.decode()
    assert str(job.pk) in failed_page and 'id="axa-retry-matching"' not in failed_page
    detail = client.get(change_url(job)).content.decode()
    assert 'id="axa-retry"' not in detail and 'id="axa-delete"' not in detail
    assert 'id="axa-cancel"' not in client.get(change_url(queued)).content.decode()
    assert client.post(retry_url(job)).status_code == 403
    assert client.post(cancel_url(queued)).status_code == 403
    assert client.post(RETRY_MATCHING, {"post": "yes"}).status_code == 403
    assert client.post(FAILED_RETRY_MATCHING, {"post": "yes"}).status_code == 403
    assert client.post(reverse("admin:axa_django_job_delete", args=[job.pk]), {"post": "yes"}).status_code == 403
    action(client, JOBS, "retry_selected", [job])
    action(client, JOBS, "cancel_selected", [queued])
    action(client, JOBS, "delete_selected", [job], post="yes")
    assert Job.objects.get(pk=job.pk).status == "failed"
    assert Job.objects.get(pk=queued.pk).status == "queued"
    assert client.get(DASHBOARD).status_code == 200


def test_retry_permission_allows_retry_only() -> None:
    client = user_with("view_job", "retry_job")
    job, queued = make_job("failed"), make_job("queued")
    html = client.get(JOBS).content.decode()
    assert "retry_selected" in html and 'id="axa-retry-matching"' in html and "cancel_selected" not in html
    assert 'id="axa-retry"' in client.get(change_url(job)).content.decode()
    assert client.post(cancel_url(queued)).status_code == 403
    assert client.post(retry_url(job)).status_code == 302
    assert Job.objects.get(pk=job.pk).status == "queued"
    assert Job.objects.get(pk=queued.pk).status == "queued"


def test_cancel_permission_allows_cancel_only() -> None:
    client = user_with("view_job", "cancel_job")
    job, queued = make_job("failed"), make_job("queued")
    html = client.get(JOBS).content.decode()
    assert "cancel_selected" in html and "retry_selected" not in html and 'id="axa-retry-matching"' not in html
    assert 'id="axa-cancel"' in client.get(change_url(queued)).content.decode()
    assert client.post(retry_url(job)).status_code == 403
    assert client.post(RETRY_MATCHING, {"post": "yes"}).status_code == 403
    response = action(client, JOBS, "cancel_selected", [queued])
    assert messages_of(response) == ["1 job cancelled (running ones asked to stop)."]
    assert Job.objects.get(pk=job.pk).status == "failed"


def test_delete_permission_allows_delete_only() -> None:
    client = user_with("view_job", "delete_job")
    job = make_job("completed")
    html = client.get(JOBS).content.decode()
    assert "delete_selected" in html and "retry_selected" not in html
    assert 'id="axa-delete"' in client.get(change_url(job)).content.decode()
    client.post(reverse("admin:axa_django_job_delete", args=[job.pk]), {"post": "yes"})
    assert not Job.objects.filter(pk=job.pk).exists()


def test_without_view_permission_nothing_is_shown_or_allowed() -> None:
    client = user_with("retry_job", "cancel_job")
    job = make_job("failed")
    for url in (JOBS, FAILED, DASHBOARD, change_url(job)):
        assert client.get(url).status_code == 403, url
    assert client.post(retry_url(job)).status_code == 403
    assert client.post(RETRY_MATCHING, {"post": "yes"}).status_code == 403
    index = client.get(reverse("admin:index")).content.decode()
    assert JOBS not in index and DASHBOARD not in index
    assert Job.objects.get(pk=job.pk).status == "failed"


def test_nobody_adds_or_edits_jobs_here(admin_client: Client) -> None:
    job = make_job("queued")
    assert admin_client.get(reverse("admin:axa_django_job_add")).status_code == 403
    admin_client.post(change_url(job), {"name": "changed", "status": "failed"})
    job.refresh_from_db()
    assert (job.name, job.status) == ("tests.testapp.jobs.add", "queued")


# The dashboard.


def test_on_a_big_history_the_dashboard_shows_estimated_totals_without_counting_every_row(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_history (id, name, args, status, finished_at) SELECT gen_random_uuid(), 'x', '{}', "
            "CASE WHEN i % 4 = 0 THEN 'failed' ELSE 'completed' END, now() FROM generate_series(1, 2000) AS i"
        )
        cursor.execute("ANALYZE axa_queue")
        cursor.execute("ANALYZE axa_history")
    monkeypatch.setattr(fleetstats, "EXACT_BELOW", 1000)  # a table this big is estimated
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(DASHBOARD)
    # Each table apart: the history estimated, not counted row by row; the small queue table counted.
    counted = [q["sql"] for q in queries if "GROUP BY status" in q["sql"]]
    assert set(counted) == {"SELECT status, count(*) FROM ONLY axa_queue GROUP BY status"}, counted
    stats = response.context["stats"]
    assert stats.counts_estimated and 1400 <= stats.counts["completed"] <= 1600, stats.counts
    html = response.content.decode()
    assert re.search(r'data-status="completed">.*?about 1,\d{3}<', html, re.S), html


def test_dashboard_counts_oldest_ready_chart_and_workers(admin_client: Client) -> None:
    make_job("queued", run_at=NOW - datetime.timedelta(minutes=90))
    make_job("queued", run_at=NOW + datetime.timedelta(hours=1))  # scheduled, not ready
    for _ in range(3):
        make_job("completed")
    make_job("failed")
    live = Worker.objects.create(hostname="box-a", pid=11, concurrency=4, queues=["default"])
    dead = Worker.objects.create(hostname="box-b", pid=22, concurrency=1, queues=[])
    Worker.objects.filter(pk=dead.pk).update(heartbeat_at=NOW - datetime.timedelta(minutes=5))
    make_job("running", worker_id=live.pk)
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    stats = response.context["stats"]
    assert stats.counts == {"waiting": 0, "queued": 2, "running": 1, "completed": 3, "failed": 1, "cancelled": 0}
    assert stats.ready == 1
    assert datetime.timedelta(minutes=89) < stats.oldest_ready_age < datetime.timedelta(minutes=95)
    assert len(stats.hours) == 24
    assert sum(h.completed for h in stats.hours) == 3 and sum(h.failed for h in stats.hours) == 1
    html = response.content.decode()
    assert "<svg" in html and "<rect" in html and "3 completed, 1 failed" in html
    assert "1 h 30 min" in html or "1 h 31 min" in html
    assert "box-a" in html and "box-b" in html and "(lease expired)" in html
    rows = {w.hostname: w for w in stats.workers}
    assert rows["box-a"].alive and rows["box-a"].running == 1 and rows["box-a"].queues == ["default"]
    assert rows["box-b"].queues == [] and "<td>all</td>" in html
    assert not rows["box-b"].alive
    assert f'href="{JOBS}?status__exact=failed"' in html


def test_the_chart_counts_each_past_hour_once_and_the_current_hour_live(admin_client: Client, caplog) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('hour', now(), 'UTC'), now()")
        current, now = cursor.fetchone()
    five_ago, two_ago = current - datetime.timedelta(hours=5), current - datetime.timedelta(hours=2)
    early = [make_job("completed", finished_at=five_ago + datetime.timedelta(minutes=10)) for _ in range(2)]
    make_job("failed", finished_at=two_ago + datetime.timedelta(minutes=1))
    make_job("completed", finished_at=now)
    hours = {h.start: h for h in admin_client.get(DASHBOARD).context["stats"].hours}
    assert (hours[five_ago].completed, hours[two_ago].failed, hours[current].completed) == (2, 1, 1)
    kept = {row.hour: (row.completed, row.failed) for row in FinishedHour.objects.all()}
    assert kept[five_ago] == (2, 0) and kept[two_ago] == (0, 1) and current not in kept
    # Every past hour that ended over SETTLE ago is kept, the empty ones too.
    ended = [current - datetime.timedelta(hours=n) for n in range(1, 24)]
    assert sorted(kept) == sorted(h for h in ended if h + datetime.timedelta(hours=1) + dashboard.SETTLE <= now)

    # A kept hour is read, not counted again: its rows pruned meanwhile still show; the
    # current hour is counted at each load.
    Job.objects.filter(pk__in=[job.pk for job in early]).delete()
    make_job("completed", finished_at=now)
    hours = {h.start: h for h in admin_client.get(DASHBOARD).context["stats"].hours}
    assert (hours[five_ago].completed, hours[current].completed) == (2, 2)

    # A database the page may not write to (a read-only replica), inside the request's
    # transaction (ATOMIC_REQUESTS): the same chart, counted, and the transaction lives on.
    FinishedHour.objects.all().delete()
    for _ in range(2):  # said once: a read-only user is refused at every load
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            stats = dashboard.collect()
            assert Job.objects.count() == 3
    hours = {h.start: h for h in stats.hours}
    assert (hours[five_ago].completed, hours[two_ago].failed, hours[current].completed) == (0, 1, 2)
    assert not FinishedHour.objects.exists()
    warned = [r for r in caplog.records if "could not keep its past hours' counts" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING"] and "read-only" in warned[0].getMessage()


def test_dashboard_of_an_empty_queue(admin_client: Client) -> None:
    html = admin_client.get(DASHBOARD).content.decode()
    assert "No worker is running." in html
    assert 'id="axa-oldest">none<' in html


def test_chart_bars_scale_to_the_busiest_hour() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    hours = [dashboard.Hour(start + datetime.timedelta(hours=i), i, 1 if i == 3 else 0) for i in range(4)]
    svg = str(dashboard.chart_svg(hours, width=200, height=100))
    heights = [float(h) for h in re.findall(r'height="([\d.]+)" class="axa-bar-ok"', svg)]
    assert heights == [0.0, 16.5, 33.0, 49.5]
    assert 'class="axa-bar-failed"' in svg and ">4</text>" in svg  # peak 3 + 1
    assert "<script" not in svg and str(dashboard.chart_svg([])).startswith("<svg")


# Helpers.


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"last_error_type": "builtins.KeyError", "last_error_message": "'k'\nmore"}, "KeyError: 'k'"),
        ({"last_error_message": None, "error_head": TRACEBACK, "error_tail": TRACEBACK}, "ValueError: boom"),
        ({"last_error_message": None, "error_head": "plain\nsecond", "error_tail": "x"}, "plain"),
        ({"last_error_message": None, "error_head": None}, ""),
    ],
)
def test_error_line(fields: dict[str, Any], line: str) -> None:
    job = Job()
    for key, value in fields.items():
        setattr(job, key, value)
    assert error_line(job) == line


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.012, "12 ms"), (3.44, "3.4 s"), (125, "2 min 5 s"), (3840, "1 h 4 min"), (90000, "1 d 1 h")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(datetime.timedelta(seconds=seconds)) == text
    assert format_duration(None) == "-"


@pytest.mark.halved
def test_list_queries_read_indexes_not_the_whole_table(admin_client: Client) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, status, created_at) "
            "SELECT gen_random_uuid(), 'tests.testapp.jobs.add', jsonb_build_object('a', i), "
            "CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 5000 = 1 THEN 'running' WHEN i % 1000 = 2 THEN 'cancelled' "
            "ELSE 'completed' END, now() - i * interval '1 second' "
            "FROM generate_series(1, 50000) AS i"
        )
        # Where a worker leaves them: finished rows in the history, a backlog in axa_queue.
        cursor.execute(
            "WITH moved AS (DELETE FROM ONLY axa_queue WHERE status IN ('completed', 'failed', 'cancelled') "
            "RETURNING *) INSERT INTO axa_history SELECT * FROM moved"
        )
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, created_at) SELECT gen_random_uuid(), 'tests.testapp.jobs.add', "
            "jsonb_build_object('a', i), now() - i * interval '1 second' FROM generate_series(1, 20000) AS i"
        )
        cursor.execute("ANALYZE axa_queue")
        cursor.execute("ANALYZE axa_history")

    def plan(url: str) -> str:
        cl = admin_client.get(url).context["cl"]
        return cl.queryset[: cl.list_per_page].explain()

    assert "axa_queue_created" in plan(JOBS)
    assert "axa_queue_status" in plan(JOBS + "?status__exact=failed")
    assert "axa_queue_status" in plan(JOBS + "?status__exact=cancelled")
    # No claim or finish writes axa_queue_status: these lists walk their own indexes.
    assert "axa_queue_running" in plan(JOBS + "?status__exact=running")
    assert "axa_queue_created" in plan(JOBS + "?status__exact=completed")
    assert "Seq Scan" not in "".join(plan(JOBS + f"?status__exact={s}") for s in ("running", "completed", "cancelled"))
    # The failed list's own order: each table's index, merged (no Sort node reading every row).
    assert "axa_queue_failed" in plan(FAILED) and "->  Sort" not in plan(FAILED)
    assert "Seq Scan" not in plan(JOBS) + plan(FAILED)


# Retrying a failed unique job whose key another job holds (issue 10, item 4.4).

REFRESH = "tests.testapp.admin_jobs.refresh_account"


def failed_unique(account: int, **fields: Any) -> Job:
    """A failed row of the unique job, as a worker leaves it after its last attempt."""
    return make_job("failed", name=REFRESH, args={"account": account}, unique_key=f"account:{account}", **fields)


def test_job_retry_skips_a_job_whose_unique_key_is_in_use() -> None:
    blocked, free = failed_unique(1), failed_unique(2)
    holder = refresh_account.perform_later(1)
    assert blocked.retry() is False
    assert blocked.status == "failed"
    assert free.retry() is True and free.status == "queued"
    holder.refresh_from_db()
    assert holder.status == "queued"


def test_queryset_retry_skips_keys_in_use_and_retries_the_rest_in_one_statement() -> None:
    held, held_by_running = failed_unique(1), failed_unique(2)
    free, plain = failed_unique(3), make_job("failed")
    holder = refresh_account.perform_later(1)
    running = refresh_account.perform_later(2)
    Job.objects.filter(pk=running.pk).update(status="running")
    with CaptureQueriesContext(connection) as queries:
        result = Job.objects.filter(status="failed").retry()
    assert int(result) == 2 and result == 2
    assert result.skipped == {held.pk: holder.pk, held_by_running.pk: running.pk}
    writes = [q["sql"] for q in queries.captured_queries if re.search(r"\bUPDATE \"?axa_queue\b", q["sql"])]
    assert len(writes) == 1, writes
    statuses = dict(Job.objects.values_list("id", "status"))
    assert (statuses[held.pk], statuses[held_by_running.pk]) == ("failed", "failed")
    assert (statuses[free.pk], statuses[plain.pk]) == ("queued", "queued")
    assert Job.objects.filter(status="failed").retry().skipped == {held.pk: holder.pk, held_by_running.pk: running.pk}


def test_two_failed_jobs_with_one_key_retry_only_the_latest_failure() -> None:
    older = failed_unique(1, finished_at=NOW - datetime.timedelta(hours=1))
    newer = failed_unique(1, finished_at=NOW - datetime.timedelta(minutes=1))
    result = Job.objects.filter(pk__in=[older.pk, newer.pk]).retry()
    assert result == 1 and result.skipped == {older.pk: newer.pk}
    assert Job.objects.get(pk=newer.pk).status == "queued"
    assert Job.objects.get(pk=older.pk).status == "failed"


def test_retry_button_reports_the_job_holding_the_key(admin_client: Client) -> None:
    job = failed_unique(1)
    holder = refresh_account.perform_later(1)
    response = admin_client.post(retry_url(job), follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == change_url(job)
    assert messages_of(response) == [
        f"Job {job.pk} was not retried: its unique key 'account:1' is in use by job {holder.pk}."
    ]
    assert Job.objects.get(pk=job.pk).status == "failed"


@pytest.mark.parametrize("page", [JOBS, FAILED])
def test_retry_selected_reports_jobs_whose_key_is_in_use(admin_client: Client, page: str) -> None:
    held, free = failed_unique(1), failed_unique(2)
    holder = refresh_account.perform_later(1)
    selected = [held, free]
    if page == JOBS:
        selected.append(make_job("completed"))
    response = action(admin_client, page, "retry_selected", selected)
    expected = "1 job queued to run again."
    if page == JOBS:
        expected += " Skipped 1 job not failed."
    expected += f" Skipped 1 job whose unique key is in use: job {held.pk} (key in use by job {holder.pk})."
    assert messages_of(response) == [expected]
    assert Job.objects.get(pk=held.pk).status == "failed"
    assert Job.objects.get(pk=free.pk).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_retry_loses_the_race_to_a_concurrent_enqueue_without_an_integrity_error() -> None:
    job, other = failed_unique(1), failed_unique(2)
    enqueue = psycopg.connect(database_url())  # not autocommit: the INSERT stays open until commit

    def retry_in_a_transaction() -> tuple[RetryResult, str]:
        try:
            with transaction.atomic():
                result = Job.objects.filter(pk__in=[job.pk, other.pk]).retry()
                return result, Job.objects.filter(pk=other.pk).values_list("status", flat=True).get()
        finally:
            connections.close_all()

    def retry_waits_on_the_insert() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND query LIKE %s",
                ["%WITH RECURSIVE candidate%"],  # the retry statement
            )
            return cursor.fetchone()[0] == 1

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        holder = enqueue.execute(
            "INSERT INTO axa_queue (id, name, args, unique_key) "
            "VALUES (gen_random_uuid(), %s, '{\"account\": 1}', 'account:1') RETURNING id",
            [REFRESH],
        ).fetchone()[0]
        future = pool.submit(retry_in_a_transaction)
        wait_for(retry_waits_on_the_insert, what="the retry to wait on the uncommitted enqueue")
        enqueue.commit()
        result, other_status = future.result(timeout=60)
    finally:
        enqueue.close()  # first, so a retry still waiting on the INSERT is released
        pool.shutdown()
    assert result == 1 and result.skipped == {job.pk: holder}
    assert other_status == "queued"  # the savepoint kept the caller's transaction usable
    assert Job.objects.get(pk=job.pk).status == "failed"
