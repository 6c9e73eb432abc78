"""Bulk retry, cancel and delete by a list's filter, through Django's test client (issue 47, bullet 4).

The operation's job runs here in-process (``run_jobs``), in the test's transaction: its
batches are savepoints. A real worker running it, a restart mid-way and the races
against a worker's statements are in tests/test_bulk_worker.py.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from axa_django.admin import bulk, bulkjob
from axa_django.models import Job
from axa_django.models.queue import BulkOperation
from axa_django.testing import run_jobs
from tests.conftest import database_url
from tests.test_admin import FAILED, JOBS, make_job, messages_of, user_with
from tests.testapp.admin_jobs import refresh_account

pytestmark = pytest.mark.django_db

OPS = reverse("admin:axa_django_bulkoperation_changelist")
HOSTILE = "<script>alert('x')</script>"
HOUR, MINUTE = datetime.timedelta(hours=1), datetime.timedelta(minutes=1)


def start_url(list_name: str, kind: str, query: str = "") -> str:
    url = reverse("admin:axa_django_bulkoperation_start", args=[list_name, kind])
    return f"{url}?{query}" if query else url


def progress_url(op: BulkOperation) -> str:
    return reverse("admin:axa_django_bulkoperation_change", args=[op.pk])


def data_url(op: BulkOperation) -> str:
    return reverse("admin:axa_django_bulkoperation_data", args=[op.pk])


def sql_count(where: str, params: list[Any]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM axa_queue WHERE {where}", params)
        return cursor.fetchone()[0]


def confirm(client: Client, url: str, **pace: int) -> BulkOperation:
    """POST the confirmation; return the operation it started (the response is its progress page)."""
    response = client.post(url, {"batch_size": 1000, "pause_ms": 0, **pace})
    assert response.status_code == 302, response.content.decode()[:2000]
    op = BulkOperation.objects.latest("id")
    assert response["Location"] == progress_url(op)
    return op


def run(op: BulkOperation) -> BulkOperation:
    """Run the operation's job here, as a worker would; return the operation as it ended."""
    run_jobs(bulkjob.NAME)
    op.refresh_from_db()
    return op


def shown(client: Client, op: BulkOperation) -> str:
    return client.get(progress_url(op)).content.decode()


def test_a_bulk_retry_asks_first_then_runs_in_batches_and_reports_every_figure(admin_client: Client, caplog) -> None:
    mine = [make_job("failed", name="CountWorker", args={"fail": True, "n": n}) for n in range(7)]
    other = make_job("failed")
    make_job("completed", name="CountWorker", args={"fail": False})
    listing = admin_client.get(JOBS, {"name": "CountWorker", "p": "1"}).content.decode()
    url = start_url("job", "retry", "name=CountWorker")
    assert f'href="{url}&amp;p=1"' in listing or f'href="{url}"' in listing
    assert 'id="axa-cancel-matching"' in listing and 'id="axa-delete-matching"' in listing

    page = admin_client.get(url + "&p=1")  # the page shown is dropped: not part of the filter
    html = page.content.decode()
    expected = sql_count("name = %s AND status = 'failed'", ["CountWorker"])
    assert expected == 7
    assert f"Retry <strong>{expected}</strong> failed jobs to queue again to run now?" in html
    assert "<code>name</code> = CountWorker" in html and "<code>p</code>" not in html
    assert 'value="Yes, retry 7 jobs"' in html and 'id="axa-unserved"' in html  # no worker runs here
    assert BulkOperation.objects.count() == 0

    caplog.set_level(logging.INFO, logger="axa_django")
    op = confirm(admin_client, url, batch_size=3)
    assert (op.kind, op.list_name, op.query, op.started_by, op.estimate, op.status) == (
        "retry",
        "job",
        "name=CountWorker",
        "admin",
        7,
        "queued",
    )
    assert Job.objects.get(pk=op.job_id).name == bulkjob.NAME
    assert "Queued" in shown(admin_client, op)
    op = run(op)
    retried = sql_count("id = ANY(%s) AND status = 'queued' AND attempts = 0", [[j.pk for j in mine]])
    assert (op.status, op.matched, op.changed, op.skipped, retried) == ("done", 7, 7, 0, 7)
    assert op.batches == 3  # 3 + 3 + 1, the last one reaching the bound
    assert Job.objects.get(pk=other.pk).status == "failed"

    html = shown(admin_client, op)
    for figure in ("axa-bulk-matched", "axa-bulk-changed"):
        assert f'id="{figure}">7</span>' in html
    assert 'id="axa-bulk-skipped">0</span>' in html and "Done" in html and 'data-state="over"' in html
    data = admin_client.get(data_url(op)).json()
    assert (data["status"], data["matched"], data["changed"], data["skipped"], data["live"]) == (
        "done",
        "7",
        "7",
        "0",
        False,
    )
    listed = admin_client.get(OPS).content.decode()
    assert f"#{op.pk} retry" in listed and "job?name=CountWorker" in listed

    entries = LogEntry.objects.filter(object_id=str(op.pk)).order_by("id")
    assert [(e.action_flag, e.user.username) for e in entries] == [(ADDITION, "admin"), (CHANGE, "admin")]
    assert "7 matched, 7 changed, 0 skipped" in entries[1].change_message
    said = [r.getMessage() for r in caplog.records if r.name == "axa_django" and r.levelno == logging.INFO]
    assert any("by admin (list job?name=CountWorker): done: 7 matched, 7 changed" in line for line in said), said


def test_a_search_term_is_read_as_the_list_reads_it(admin_client: Client) -> None:
    hit = make_job("failed", args={"customer": "acme"})
    miss = make_job("failed", args={"customer": "other"})
    page = admin_client.get(start_url("failedjob", "retry", "q=acme")).content.decode()
    assert "Retry <strong>1</strong> failed job to queue again" in page
    op = run(confirm(admin_client, start_url("failedjob", "retry", "q=acme")))
    assert (op.matched, op.changed) == (1, 1)
    assert sql_count("id = %s AND status = 'queued'", [hit.pk]) == 1
    assert sql_count("id = %s AND status = 'failed'", [miss.pk]) == 1


def test_an_empty_match_offers_nothing_to_confirm_and_starts_nothing(admin_client: Client) -> None:
    make_job("queued")
    url = start_url("failedjob", "retry", "q=nothing-matches-this")
    html = admin_client.get(url).content.decode()
    assert "there is nothing to do" in html and 'id="axa-bulk-confirm"' not in html
    response = admin_client.post(url, {"batch_size": 1000, "pause_ms": 0})
    assert response.status_code == 200 and BulkOperation.objects.count() == 0


def test_cancel_and_delete_by_filter_act_as_the_per_row_actions(admin_client: Client) -> None:
    queued = [make_job("queued", name="CountWorker", args={"fail": False}) for _ in range(4)]
    done = make_job("completed", name="CountWorker", args={"fail": False})
    kept = make_job("queued")
    op = run(confirm(admin_client, start_url("job", "cancel", "name=CountWorker"), batch_size=2))
    cancelled = sql_count("id = ANY(%s) AND status = 'cancelled'", [[j.pk for j in queued]])
    assert (op.status, op.matched, op.changed, op.skipped, cancelled) == ("done", 4, 4, 0, 4)
    assert Job.objects.get(pk=kept.pk).status == "queued" and Job.objects.get(pk=done.pk).status == "completed"

    before = sql_count("name = %s", ["CountWorker"])
    op = run(confirm(admin_client, start_url("job", "delete", "name=CountWorker&status__exact=cancelled")))
    assert (op.matched, op.changed, before - sql_count("name = %s", ["CountWorker"])) == (4, 4, 4)
    assert Job.objects.filter(pk__in=[done.pk, kept.pk]).count() == 2


def test_a_unique_key_in_use_is_skipped_and_counted(admin_client: Client) -> None:
    name = refresh_account.name
    now = timezone.now()
    older = make_job("failed", name=name, args={"account": 1}, unique_key="account:1", finished_at=now - HOUR)
    newer = make_job("failed", name=name, args={"account": 1}, unique_key="account:1", finished_at=now - MINUTE)
    held = make_job("failed", name=name, args={"account": 2}, unique_key="account:2")
    refresh_account.perform_later(2)
    op = run(confirm(admin_client, start_url("failedjob", "retry", f"name={name}")))
    queued = sql_count("name = %s AND status = 'queued'", [name])
    assert (op.matched, op.changed, op.skipped_key, queued) == (3, 1, 2, 2)
    # In one batch, as one retry: the latest failure is queued.
    assert (Job.objects.get(pk=older.pk).status, Job.objects.get(pk=newer.pk).status) == ("failed", "queued")
    assert Job.objects.get(pk=held.pk).status == "failed"
    assert 'data-figure="skipped_key">2</td>' in shown(admin_client, op)


def test_each_kind_needs_its_permission_and_is_refused_with_403() -> None:
    job = make_job("failed")
    viewer = user_with("view_job")
    listing = viewer.get(JOBS).content.decode()
    assert 'id="axa-bulk-links"' not in listing
    for kind in ("retry", "cancel", "delete"):
        assert viewer.get(start_url("job", kind)).status_code == 403
        assert viewer.post(start_url("job", kind), {"batch_size": 10, "pause_ms": 0}).status_code == 403
    canceller = user_with("view_job", "cancel_job")
    html = canceller.get(FAILED).content.decode()
    assert 'id="axa-cancel-matching"' in html and 'id="axa-retry-matching"' not in html
    assert canceller.post(start_url("failedjob", "retry"), {"batch_size": 10, "pause_ms": 0}).status_code == 403
    assert BulkOperation.objects.count() == 0 and Job.objects.get(pk=job.pk).status == "failed"
    # A retry operation: cancelled only by whoever may retry; seen by whoever may view jobs.
    retrier = user_with("view_job", "retry_job")
    op = confirm(retrier, start_url("failedjob", "retry"))
    assert canceller.post(reverse("admin:axa_django_bulkoperation_cancel", args=[op.pk])).status_code == 403
    assert 'id="axa-bulk-cancel"' not in shown(viewer, op) and 'id="axa-bulk-cancel"' in shown(retrier, op)
    assert user_with().get(progress_url(op)).status_code == 403
    assert user_with().get(data_url(op)).status_code == 403
    assert viewer.post(data_url(op)).status_code == 405
    assert retrier.get(reverse("admin:axa_django_bulkoperation_cancel", args=[op.pk])).status_code == 405
    op.refresh_from_db()
    assert (op.status, op.cancel_requested) == ("queued", False)


def test_a_cancel_before_any_worker_began_ends_it_and_its_job(admin_client: Client) -> None:
    make_job("failed")
    op = confirm(admin_client, start_url("failedjob", "retry"))
    response = admin_client.post(reverse("admin:axa_django_bulkoperation_cancel", args=[op.pk]), follow=True)
    assert messages_of(response) == [f"Bulk retry #{op.pk} was cancelled before it started."]
    op.refresh_from_db()
    assert (op.status, op.cancelled_by, Job.objects.get(pk=op.job_id).status) == ("cancelled", "admin", "cancelled")
    assert run_jobs(bulkjob.NAME) == []  # its job is cancelled: nothing runs
    assert sql_count("status = 'failed'", []) == 1
    again = admin_client.post(reverse("admin:axa_django_bulkoperation_cancel", args=[op.pk]), follow=True)
    assert "nothing to cancel" in messages_of(again)[0]


def test_a_failed_operation_says_why_and_resumes_from_its_position(admin_client: Client) -> None:
    jobs = [make_job("failed") for _ in range(3)]
    op = confirm(admin_client, start_url("failedjob", "retry"), batch_size=1)
    # The list's filter cannot be read again (a filter removed from the admin, say).
    BulkOperation.objects.filter(pk=op.pk).update(query="nonsense__field=1")
    op = run(op)
    assert op.status == "failed" and "cannot be read again" in op.error
    assert 'id="axa-bulk-resume"' in shown(admin_client, op)
    BulkOperation.objects.filter(pk=op.pk).update(query="", position=sorted(j.pk for j in jobs)[0])
    admin_client.post(reverse("admin:axa_django_bulkoperation_resume", args=[op.pk]))
    op = run(op)
    assert (op.status, op.matched, op.changed, op.error) == ("done", 2, 2, "")
    assert sql_count("status = 'failed'", []) == 1  # the one before the saved position


def test_bad_input_gets_a_message_or_a_400_and_starts_nothing(admin_client: Client) -> None:
    make_job("failed")
    url = start_url("failedjob", "retry")
    for pace in (
        {"batch_size": "abc", "pause_ms": 0},
        {"batch_size": 0, "pause_ms": 0},
        {"batch_size": 10, "pause_ms": -1},
    ):
        response = admin_client.post(url, pace)
        assert response.status_code == 200 and 'class="errorlist' in response.content.decode()
    assert admin_client.get(url + "?q=a%00b").status_code == 400
    assert admin_client.get(OPS + "?q=%00").status_code == 400
    bad = admin_client.get(start_url("failedjob", "retry", "nonsense__field=1"), follow=True)
    assert "not valid" in messages_of(bad)[0]
    assert admin_client.get(start_url("job", "explode")).status_code == 404
    assert admin_client.get(start_url("queuedashboard", "retry")).status_code == 404
    assert (
        admin_client.get(reverse("admin:axa_django_bulkoperation_change", args=["nope"]), follow=True).status_code
        == 200
    )
    assert BulkOperation.objects.count() == 0


def test_the_progress_page_and_the_list_escape_what_they_show(admin_client: Client) -> None:
    make_job("failed", args={"note": HOSTILE})
    op = confirm(admin_client, start_url("failedjob", "retry", "q=" + HOSTILE))
    BulkOperation.objects.filter(pk=op.pk).update(started_by=HOSTILE, error=HOSTILE)
    for html in (shown(admin_client, op), admin_client.get(OPS).content.decode()):
        assert HOSTILE not in html and "&lt;script&gt;" in html


def test_the_former_retry_matching_url_leads_to_the_bulk_retry(admin_client: Client) -> None:
    response = admin_client.get(reverse("admin:axa_django_failedjob_retry_matching") + "?q=x")
    assert response.status_code == 302 and response["Location"] == start_url("failedjob", "retry", "q=x")
    assert user_with("view_job").get(reverse("admin:axa_django_job_retry_matching")).status_code == 403


def test_jobs_made_after_the_confirmation_are_left_out(admin_client: Client) -> None:
    first = make_job("failed")
    op = confirm(admin_client, start_url("failedjob", "retry"))
    later = Job.objects.create(id=uuid.UUID(int=op.bound.int + 1), name="CountWorker", status="failed")
    op = run(op)
    assert (op.matched, op.changed) == (1, 1)
    assert Job.objects.get(pk=first.pk).status == "queued" and Job.objects.get(pk=later.pk).status == "failed"


def test_a_batch_that_times_out_on_a_lock_goes_row_by_row_and_keeps_the_held_row_for_the_end(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another session enqueues a job with the failed one's unique key and holds its transaction
    # open: queuing the failed one again waits on that insert (the unique index), past lock_timeout.
    monkeypatch.setattr(bulkjob, "BUSY_PAUSE", 0.05)
    monkeypatch.setattr(bulkjob, "LOCK_TIMEOUT", "100ms")  # nine waits in all: three per batch, row, round
    name = refresh_account.name
    held = make_job("failed", name=name, args={"account": 1}, unique_key="account:1")
    free = make_job("failed", name=name, args={"account": 2}, unique_key="account:2")
    op = confirm(admin_client, start_url("failedjob", "retry", f"name={name}"))
    other = psycopg.connect(database_url())
    try:
        other.execute(
            "INSERT INTO axa_queue (id, name, args, unique_key) VALUES (gen_random_uuid(), %s, '{\"account\": 1}', "
            "'account:1')",
            [name],
        )
        op = run(op)
    finally:
        other.rollback()
        other.close()
    assert (op.status, op.matched, op.changed, op.skipped_busy, op.skipped) == ("done", 2, 1, 1, 1)
    assert (Job.objects.get(pk=held.pk).status, Job.objects.get(pk=free.pk).status) == ("failed", "queued")
    assert 'data-figure="skipped_busy">1</td>' in shown(admin_client, op)


def test_an_operation_its_job_left_says_so_and_resumes(admin_client: Client) -> None:
    make_job("failed")
    op = confirm(admin_client, start_url("failedjob", "retry"))
    Job.objects.filter(pk=op.job_id).cancel()  # as if its workers had died under it MAX_LOSSES times
    html = shown(admin_client, op)
    assert "Its job is cancelled and will not go on with it" in html and 'id="axa-bulk-resume"' in html
    assert "Its job is cancelled" in admin_client.get(data_url(op)).json()["unserved"]
    admin_client.post(reverse("admin:axa_django_bulkoperation_resume", args=[op.pk]))
    op = run(op)
    assert (op.status, op.matched, op.changed, sql_count("status = 'failed'", [])) == ("done", 1, 1, 0)


@pytest.mark.parametrize("seed_row", [False, True])
def test_jobs_made_after_the_confirmation_are_left_out_whatever_their_ids(admin_client: Client, seed_row: bool) -> None:
    # The Rust crate writes version 4 ids: one in the history made the greatest id (the walk's
    # bound) lie above every id made for years, and jobs enqueued after the confirmation were
    # cancelled with the rest (the adversarial review's case).
    if seed_row:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO axa_history (id, name, args, status, attempts, max_attempts, run_at, finished_at) "
                "VALUES ('f47ac10b-58cc-4372-a567-0e02b2c3d479', 'rust.job', '{}', 'completed', 1, 1, now(), now())"
            )
    before = [Job.objects.create(name="tests.bulk.late", args={}, status="queued").pk for _ in range(3)]
    op = confirm(admin_client, start_url("job", "cancel", "q=name:tests.bulk.late"), batch_size=10, pause_ms=0)
    after = [Job.objects.create(name="tests.bulk.late", args={}, status="queued").pk for _ in range(3)]
    run(op)
    statuses = dict(Job.objects.filter(pk__in=before + after).values_list("pk", "status"))
    assert [statuses[pk] for pk in before] == ["cancelled"] * 3
    assert [statuses[pk] for pk in after] == ["queued"] * 3


@pytest.mark.parametrize("kind", ["retry", "cancel", "delete"])
def test_the_confirmations_count_stops_at_the_searchs_bound_and_the_operation_can_still_start(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(bulk, "SEARCH_SECONDS", 0.3)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '4s'")  # a count without the bound fails here rather than hangs
    with psycopg.connect(database_url(), autocommit=True) as other, other.transaction():
        other.execute("LOCK TABLE axa_history IN ACCESS EXCLUSIVE MODE")
        page = admin_client.get(start_url("job", kind, "q=error:nomatch"))
        assert page.status_code == 200 and page.context["count"] is None
        assert "not counted within 0.3 s" in page.content.decode()
        assert 'id="axa-bulk-confirm"' in page.content.decode()


def test_the_pause_between_batches_is_at_least_twice_as_long_as_the_batch_took(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fixed 500 ms was half a batch at 10,000,000 jobs: a worker draining beside it ran at
    # 0.69x. Batches made slow here (by 0.3 s each); the pause asked for is 50 ms.
    for _ in range(3):
        make_job(status="failed")
    slept: list[float] = []
    batch, real_sleep = bulkjob.Runner.batch, bulkjob.time.sleep

    def slow_batch(self: bulkjob.Runner, *args: Any, **kwargs: Any) -> Any:
        real_sleep(0.3)
        return batch(self, *args, **kwargs)

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(bulkjob.Runner, "batch", slow_batch)
    op = confirm(admin_client, start_url("failedjob", "retry"), batch_size=1, pause_ms=50)
    monkeypatch.setattr(bulkjob.time, "sleep", sleep)
    assert run(op).status == "done" and op.changed == 3
    assert 0.05 not in slept and sum(1 for seconds in slept if seconds >= 2 * 0.3) >= 2, slept


def test_the_pause_after_a_batch_never_runs_past_the_slices_end(monkeypatch: pytest.MonkeyPatch) -> None:
    # Paced at twice a 0.6 s batch, the pause ran 1.2 s past a 1 s slice (found in review):
    # a worker asked to stop waits for the slice.
    monkeypatch.setattr(bulkjob, "SLICE_SECONDS", 1.0)
    runner = bulkjob.Runner(0, None)
    batches: list[float] = []

    def batch(jobs: Any, held: bool = False) -> tuple[str, float]:
        batches.append(time.monotonic())
        time.sleep(0.6)
        return bulkjob.MORE, 0.001

    monkeypatch.setattr(runner, "batch", batch)
    began = time.monotonic()
    assert runner.walk(None) == bulkjob.SLICED  # type: ignore[arg-type]
    took = time.monotonic() - began
    assert len(batches) == 1 and 1.0 <= took < 1.0 + 0.3, (batches, took)
