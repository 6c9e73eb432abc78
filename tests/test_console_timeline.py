"""A job's timeline on its admin page, its workflow neighbourhood as a graph, and "Run now", through the test client.

Every figure the page shows (times, the wait, the run, counts of neighbours) is checked
against SQL of the test's own.
"""

from __future__ import annotations

import datetime
import logging
import re
import uuid
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from axa_django import Job, workflow
from axa_django.admin import timeline
from axa_django.admin.display import format_duration, full_time
from axa_django.models import Dependency, Worker
from tests.test_admin import user_with
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - datetime.timedelta(hours=1)


def job_url(job: Any) -> str:
    return reverse("admin:axa_django_job_change", args=[job.pk])


def run_now_url(job: Any) -> str:
    return reverse("admin:axa_django_job_run_now", args=[job.pk])


def page(client: Client, job: Any) -> str:
    response = client.get(job_url(job))
    assert response.status_code == 200
    return response.content.decode()


def timeline_rows(html: str) -> list[tuple[str, str, str, str]]:
    """The timeline's rows as (when, after enqueue, event, detail), as the page's text has them."""
    body = html.split('id="axa-timeline"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(
        r'<td class="axa-when">(.*?)</td><td class="axa-since">(.*?)</td>'
        r'<td class="axa-what">(.*?)</td><td class="axa-detail">(.*?)</td>',
        body,
    )
    return [tuple(cell.strip() for cell in row) for row in rows]


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def sql_one(statement: str, *params: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()


def test_a_retried_job_shows_each_attempt_with_its_worker_and_the_wait_and_run_of_the_last(
    admin_client: Client,
) -> None:
    here = Worker.objects.create(hostname="web-<1>&", pid=4242, concurrency=4)
    gone = uuid.uuid4()  # a worker whose row is no longer there: the id alone
    job = Job.objects.create(
        name="tests.testapp.jobs.add",
        args={"a": 1},
        status="completed",
        attempts=3,
        max_attempts=3,
        worker_id=here.pk,
        errors=[
            {"attempt": 1, "at": (T0 + datetime.timedelta(seconds=5)).isoformat(), "worker": str(gone),
             "type": "builtins.ValueError", "message": "first <img src=x onerror=alert(1)>", "traceback": "tb"},
            {"attempt": 2, "at": (T0 + datetime.timedelta(seconds=9)).isoformat(), "worker": str(here.pk),
             "type": "axa_django.WorkerLost", "message": "its worker died", "traceback": ""},
        ],
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(
        created_at=T0,
        run_at=T0 + datetime.timedelta(seconds=12),
        started_at=T0 + datetime.timedelta(seconds=12, milliseconds=340),
        finished_at=T0 + datetime.timedelta(seconds=14, milliseconds=840),
    )
    html = page(admin_client, job)
    rows = timeline_rows(html)
    assert [row[2] for row in rows] == [
        "Enqueued",
        "Attempt 1 ended",
        "Attempt 2 ended",
        "Ready again",
        "Started attempt 3",
        "Completed",
    ]
    # Times and the offsets from the enqueue, against the row's own columns.
    created, run_at, started, finished = sql_one(
        "SELECT created_at, run_at, started_at, finished_at FROM axa_queue WHERE id = %s", job.pk
    )
    assert rows[0][0] == full_time(created) and rows[3][0] == full_time(run_at)
    assert rows[4][0] == full_time(started) and rows[5][0] == full_time(finished)
    assert rows[5][1] == "+" + format_duration(finished - created)
    # Each attempt names its worker: host and pid while registered, else the id alone; all escaped.
    assert f"on web-&lt;1&gt;&amp; pid 4242 ({here.pk})" in rows[2][3] and f"on {gone})" in rows[1][3]
    assert "ValueError: first &lt;img src=x onerror=alert(1)&gt;" in rows[1][3] and "<img" not in html
    assert "on web-&lt;1&gt;&amp; pid 4242" in rows[4][3]
    # The wait (ready to started) and the run (started to finished) of the latest attempt, by SQL.
    wait, ran = sql_one("SELECT started_at - run_at, finished_at - started_at FROM axa_queue WHERE id = %s", job.pk)
    assert f"Waited (ready to started): <strong>{format_duration(wait)}</strong>" in html
    assert f"Ran (started to finished): <strong>{format_duration(ran)}</strong>" in html
    assert format_duration(wait) == "340 ms" and format_duration(ran) == "2.5 s"
    assert "the latest attempt" in html
    assert 'id="axa-run-now"' not in html  # not scheduled


def test_a_workflow_child_became_ready_when_its_last_parent_ended_and_the_graph_links_both_ways(
    admin_client: Client,
) -> None:
    with workflow("nightly <b>") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2)
        c = wf.add(wj.noop, 3, after=[a, b])
    waiting = page(admin_client, c)
    assert [row[2] for row in timeline_rows(waiting)] == ["Enqueued", "Waiting for 2 of 2 parents"]
    assert "Waiting so far" not in waiting and "Waited (ready to started): <strong>-</strong>" in waiting
    # As workers leave them: the parents end 10 and 20 s after the enqueue, the child starts 0.5 s later.
    Job.objects.filter(workflow_id=wf.id).update(created_at=T0, run_at=T0)
    for parent, seconds in ((a, 20), (b, 10)):
        Job.objects.filter(pk=parent.pk).update(
            status="completed", started_at=T0 + datetime.timedelta(seconds=seconds - 1),
            finished_at=T0 + datetime.timedelta(seconds=seconds),
        )  # fmt: skip
    Job.objects.filter(pk=c.pk).update(
        status="completed", attempts=1, started_at=T0 + datetime.timedelta(seconds=20.5),
        finished_at=T0 + datetime.timedelta(seconds=21),
    )  # fmt: skip
    html = page(admin_client, c)
    rows = timeline_rows(html)
    events = [row[2] for row in rows]
    assert events == ["Enqueued", "Parents done", "Became ready", "Started attempt 1", "Completed"]
    last_parent, started = sql_one(
        "SELECT max(p.finished_at), (SELECT started_at FROM axa_queue WHERE id = %s) FROM axa_dependency d "
        "JOIN axa_queue p ON p.id = d.parent_id WHERE d.child_id = %s",
        c.pk,
        c.pk,
    )
    assert rows[1][0] == full_time(last_parent) and rows[1][3] == "the last of 2 parent(s) ended"
    assert f"Waited (ready to started): <strong>{format_duration(started - last_parent)}</strong>" in html
    # The graph: both parents linked, each with its status; the job itself is not a link.
    graph = html.split('id="axa-graph"', 1)[1].split("</svg>", 1)[0]
    for parent in (a, b):
        assert f'<a href="{job_url(parent)}"><g class="axa-node axa-node-completed" data-job="{parent.pk}">' in graph
    assert f'data-job="{c.pk}"' in graph and f'href="{job_url(c)}"' not in graph
    assert graph.count('class="axa-edge"') == 2
    assert reverse("admin:axa_django_workflow_change", args=[wf.id]) in html and "nightly &lt;b&gt;" in html
    # From a parent, the child is linked.
    parent_graph = page(admin_client, a).split('id="axa-graph"', 1)[1]
    assert f'<a href="{job_url(c)}"><g class="axa-node axa-node-completed"' in parent_graph


def test_a_fan_in_draws_some_parents_and_counts_the_rest(admin_client: Client) -> None:
    parents = wj.noop.perform_later_many([{"i": i} for i in range(25)])
    child = wj.noop.using(after=parents).perform_later(0)
    # A parent with a hostile name (a foreign producer's row): shown as text.
    Job.objects.filter(pk=parents[0].pk).update(name="<script>alert(1)</script>", status="failed")
    html = page(admin_client, child)
    graph = html.split('id="axa-graph"', 1)[1].split("</svg>", 1)[0]
    edges = sql_one("SELECT count(*) FROM axa_dependency WHERE child_id = %s", child.pk)[0]
    assert graph.count("axa-node-waiting") == 1 and graph.count('class="axa-edge"') == 8
    assert f"and {edges - 8} more parents" in graph and edges == 25
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in graph and "<script>alert" not in html
    ended = sql_one(
        "SELECT count(*) FILTER (WHERE p.status IN ('completed', 'failed', 'cancelled')) FROM axa_dependency d "
        "JOIN axa_queue p ON p.id = d.parent_id WHERE d.child_id = %s",
        child.pk,
    )[0]
    assert f"Waiting for {edges - ended} of {edges} parents" in html


# Finished parents in the history, their edges counted, as a fan-in's workers leave them.
WIDE = """
WITH parents AS (
    INSERT INTO axa_history (id, name, args, status, has_children, attempts, max_attempts, run_at, started_at, finished_at)
    SELECT gen_random_uuid(), 'tests.testapp.jobs.add', '{}', 'completed', true, 1, 1, now(), now(), now()
    FROM generate_series(1, %s) RETURNING id
)
INSERT INTO axa_dependency (parent_id, child_id, done) SELECT id, %s, true FROM parents
"""


# What a job's page may read: EDGES_READ edges, counted again, and their parents, each probed
# in the test's few queued rows (a sequential scan) and the history's primary key.
BOUND = 12 * timeline.EDGES_READ


def rows_read(client: Client, job: Any) -> tuple[int, str]:
    """Rows and index entries of axa_ tables the job's page reads (this transaction's statistics), and the page."""
    count = (
        "SELECT sum(pg_stat_get_xact_tuples_returned(oid) + pg_stat_get_xact_tuples_fetched(oid)) FROM pg_class "
        "WHERE relname LIKE 'axa\\_%%'"
    )
    before = sql_one(count)[0]
    html = page(client, job)
    return int(sql_one(count)[0] - before), html


def test_a_wide_fan_in_or_fan_out_reads_a_bounded_number_of_rows_and_says_over(admin_client: Client) -> None:
    # Before: one probe per parent and a count of every edge (300,000 parents: 1.5-3.4 s a page).
    open_parents = wj.noop.perform_later_many([{"i": 1}, {"i": 2}])
    child = wj.noop.using(after=open_parents).perform_later(0)
    reads = []
    for more in (1_200, 4_800):  # the same rows read at 1,202 parents and at 6,002
        with connection.cursor() as cursor:
            cursor.execute(WIDE, [more, child.pk])
            cursor.execute("ANALYZE axa_history, axa_dependency")
        read, html = rows_read(admin_client, child)
        reads.append(read)
    assert reads[1] <= reads[0] + 20 and read < BOUND, reads  # 6,002 edges and parents: 48,000 before
    edges, pending, uncounted = sql_one(
        "SELECT count(*), (SELECT pending_parents FROM axa_queue WHERE id = %s), count(*) FILTER (WHERE NOT done) "
        "FROM axa_dependency WHERE child_id = %s",
        child.pk,
        child.pk,
    )
    assert edges == 6_002 > timeline.EDGES_READ and pending == uncounted == 2
    assert [row[2:] for row in timeline_rows(html)][1:] == [
        ("Waiting for 2 parents", "of over 1,000, as its row counts")
    ]
    graph = html.split('id="axa-graph"', 1)[1].split("</svg>", 1)[0]
    first = [
        row[0] for row in sql("SELECT parent_id FROM axa_dependency WHERE child_id = %s ORDER BY 1 LIMIT 8", child.pk)
    ]
    assert re.findall(r'data-job="([^"]+)"', graph) == [str(child.pk), *map(str, first)]
    assert "and over 992 more parents" in graph and 'aria-label="This job with over 1,000 parent(s)' in graph
    assert "<br>and over 980 more" in html  # the Workflow fieldset's 20 links
    # Every parent ended and counted: done, and when is not read.
    Job.objects.filter(pk__in=[p.pk for p in open_parents]).update(status="completed", finished_at=T0)
    Dependency.objects.filter(child_id=child.pk).update(done=True)
    Job.objects.filter(pk=child.pk).update(status="queued", pending_parents=0)
    read, html = rows_read(admin_client, child)
    assert [row[2:] for row in timeline_rows(html)][1:] == [
        ("Parents done", "the last of over 1,000 parent(s) ended (when is not read: that would read every parent)")
    ]
    assert timeline_rows(html)[1][:2] == ("-", "") and read < BOUND, read
    # A fan-out: a parent's 2,000 children are counted as far as the page reads.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_dependency (parent_id, child_id, done) SELECT %s, gen_random_uuid(), true "
            "FROM generate_series(1, 2000)",
            [open_parents[0].pk],
        )
    read, html = rows_read(admin_client, open_parents[0])
    assert "and over 992 more children" in html and "<br>and over 980 more" in html and read < BOUND, read


def test_run_now_moves_a_scheduled_job_logs_it_and_records_it_in_the_history(caplog: Any) -> None:
    client = user_with("view_job", "retry_job")
    job = wj.noop.using(delay=datetime.timedelta(hours=2)).perform_later(7)
    html = page(client, job)
    assert 'id="axa-run-now"' in html and "Scheduled to run" in html
    assert "Waiting so far" not in html
    with caplog.at_level(logging.INFO, logger="axa_django"):
        response = client.post(run_now_url(job), follow=True)
    assert response.status_code == 200
    assert sql_one("SELECT run_at <= clock_timestamp(), status FROM axa_queue WHERE id = %s", job.pk) == (
        True,
        "queued",
    )
    text = [str(m) for m in response.context["messages"]]
    assert len(text) == 1 and text[0].startswith(f"Job {job.pk} runs now (it was scheduled for ")
    assert 'id="axa-run-now"' not in response.content.decode()
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.get_change_message().startswith("Run now: was scheduled for ")
    lines = [r.getMessage() for r in caplog.records if "to run now" in r.getMessage()]
    assert len(lines) == 1 and str(job.pk) in lines[0] and "1 job changed" in lines[0]
    # Again: it is due already, nothing moves, the page says why.
    before = sql_one("SELECT run_at FROM axa_queue WHERE id = %s", job.pk)[0]
    again = client.post(run_now_url(job), follow=True)
    assert [str(m) for m in again.context["messages"]] == [
        f"Job {job.pk} was not moved: it is already due, not scheduled."
    ]
    assert sql_one("SELECT run_at FROM axa_queue WHERE id = %s", job.pk)[0] == before
    assert LogEntry.objects.filter(object_id=str(job.pk)).count() == 1


def test_run_now_needs_retry_permission_and_a_post() -> None:
    job = wj.noop.using(delay=datetime.timedelta(hours=2)).perform_later(8)
    viewer = user_with("view_job", "cancel_job")
    assert 'id="axa-run-now"' not in page(viewer, job)
    assert viewer.post(run_now_url(job)).status_code == 403
    allowed = user_with("view_job", "retry_job")
    assert allowed.get(run_now_url(job)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(pk=allowed.session["_auth_user_id"]))
    assert strict.post(run_now_url(job)).status_code == 403  # no CSRF token
    assert allowed.post(run_now_url(job) + "?x=%00").status_code == 400
    assert allowed.post(reverse("admin:axa_django_job_run_now", args=["not-a-job"])).status_code == 404
    assert sql_one("SELECT run_at > now() FROM axa_queue WHERE id = %s", job.pk) == (True,)
    assert not LogEntry.objects.exists()


def test_a_running_job_shows_its_claim_and_how_long_it_has_run(admin_client: Client) -> None:
    worker = Worker.objects.create(hostname="h1", pid=7, concurrency=1)
    job = Job.objects.create(name="tests.testapp.jobs.add", args={}, status="running", attempts=1, worker_id=worker.pk)
    Job.objects.filter(pk=job.pk).update(started_at=T0 + datetime.timedelta(minutes=10), run_at=T0, created_at=T0)
    running = "SELECT clock_timestamp() - started_at FROM axa_queue WHERE id = %s"
    before = sql_one(running, job.pk)[0]
    html = page(admin_client, job)
    after = sql_one(running, job.pk)[0]
    assert [row[2] for row in timeline_rows(html)] == ["Enqueued", "Became ready", "Started attempt 1"]
    waited = sql_one("SELECT started_at - run_at FROM axa_queue WHERE id = %s", job.pk)[0]
    assert f"Waited (ready to started): <strong>{format_duration(waited)}</strong>" in html
    shown = re.search(r"Running for: <strong>(.*?)</strong>", html)[1]  # type: ignore[index]
    assert shown in (format_duration(before), format_duration(after)), (shown, before, after)
    # Claimed ahead of a free thread: no start yet, the claim's time instead.
    Job.objects.filter(pk=job.pk).update(started_at=None)
    rows = timeline_rows(page(admin_client, job))
    assert rows[-1][2] == "Claimed for attempt 1" and rows[-1][3] == f"on h1 pid 7 ({worker.pk}), not started yet"
    assert not Dependency.objects.exists()


def ended_once(status: str, attempts: int, at: datetime.datetime, *, created: Any, run_at: Any, started: Any) -> Job:
    """A job whose attempt 1 ended at ``at``, written to the second as a worker writes it; its last attempt
    started at ``started`` and ended 90 ms later with ``status``."""
    errors = [{"attempt": 1, "at": f"{at:%Y-%m-%dT%H:%M:%SZ}", "worker": None, "type": "builtins.ValueError",
               "message": "late", "traceback": ""}]  # fmt: skip
    job = Job.objects.create(name="tests.testapp.jobs.add", args={}, status=status, attempts=attempts, errors=errors)
    Job.objects.filter(pk=job.pk).update(
        created_at=created, run_at=run_at, started_at=started, finished_at=started + datetime.timedelta(milliseconds=90)
    )
    return job


def test_the_last_attempts_end_written_to_the_second_follows_its_start(admin_client: Client) -> None:
    started = T0 + datetime.timedelta(seconds=30, milliseconds=700)
    job = ended_once("failed", 1, T0 + datetime.timedelta(seconds=30), created=T0, run_at=T0, started=started)
    rows = timeline_rows(page(admin_client, job))
    assert [row[2] for row in rows] == ["Enqueued", "Became ready", "Started attempt 1", "Attempt 1 ended", "Failed"]
    assert rows[3][0] == full_time(T0 + datetime.timedelta(seconds=30))  # shown as written


def test_an_earlier_attempts_end_written_to_the_second_follows_the_enqueue(admin_client: Client) -> None:
    # The first attempt ended in the second it was enqueued in: cut to the second, its end read
    # as before the enqueue (a quick worker in the browser test: CI, 2026-12-07).
    created = T0 + datetime.timedelta(milliseconds=600)
    started = T0 + datetime.timedelta(seconds=1, milliseconds=200)
    run_at = T0 + datetime.timedelta(milliseconds=900)
    job = ended_once("completed", 2, T0, created=created, run_at=run_at, started=started)
    rows = timeline_rows(page(admin_client, job))
    assert [row[2] for row in rows] == ["Enqueued", "Attempt 1 ended", "Ready again", "Started attempt 2", "Completed"]
    assert rows[1][0] == full_time(T0)  # shown as written


def test_with_use_tz_false_the_timeline_reads_each_time_in_time_zone(admin_client: Client) -> None:
    parents = wj.noop.perform_later_many([{"i": 1}, {"i": 2}])
    child = wj.noop.using(after=parents).perform_later(0)
    # 12:00:00.250 UTC is 07:00:00.250 in New York (EST).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axa_queue SET status = 'completed', finished_at = '2025-01-15 12:00:01.25+00' WHERE id = ANY(%s)",
            [[p.pk for p in parents]],
        )
        cursor.execute(
            "UPDATE axa_queue SET status = 'failed', created_at = '2025-01-15 12:00:00.25+00', attempts = 1, "
            "run_at = '2025-01-15 12:00:00.25+00', started_at = '2025-01-15 12:00:02.25+00', "
            "finished_at = '2025-01-15 12:00:03.25+00', errors = %s WHERE id = %s",
            ['[{"attempt": 1, "at": "2025-01-15T12:00:03Z", "type": "builtins.ValueError", "message": "x"}]', child.pk],
        )
    for use_tz in (True, False):
        with override_settings(USE_TZ=use_tz, TIME_ZONE="America/New_York"):
            rows = timeline_rows(page(admin_client, child))
        assert rows == [
            ("2025-01-15 07:00:00.250 EST", "+0 ms", "Enqueued", "queue default, priority 0"),
            ("2025-01-15 07:00:01.250 EST", "+1.0 s", "Parents done", "the last of 2 parent(s) ended"),
            ("2025-01-15 07:00:01.250 EST", "+1.0 s", "Became ready", ""),
            ("2025-01-15 07:00:02.250 EST", "+2.0 s", "Started attempt 1", "no worker recorded"),
            ("2025-01-15 07:00:03.000 EST", "+2.8 s", "Attempt 1 ended", "ValueError: x (no worker recorded)"),
            ("2025-01-15 07:00:03.250 EST", "+3.0 s", "Failed", ""),
        ], use_tz
