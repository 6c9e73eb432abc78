"""The Queues and Workers pages (issue 47): figures against SQL, controls behind permissions, the graceful stop.

Client tests run in-process on real PostgreSQL; the stop runs against real runworker
processes; the stop request's write on axa_worker meets the heartbeat's in the race harness.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.urls import reverse

from axa_django import Job, sql
from axa_django.admin import bulk, bulkjob, periodic
from axa_django.models import QueueLimit, QueuePause, Worker
from axa_django.models.queue import LiveWorker, Queue
from axa_django.ops import fleetview
from axa_django.worker import connect
from axa_django.worker.control import Control
from axa_django.worker.heartbeat import Heartbeat
from axa_django.worker.ledger import Ledger
from axa_django.worker.options import Options
from tests.conftest import AXA_APPS, Workers, wait_for
from tests.races import Actor, register, run_into
from tests.testapp import ops_jobs

QUEUES = reverse("admin:axa_django_queue_changelist")
QUEUES_DATA = reverse("admin:axa_django_queue_data")
ACTION = reverse("admin:axa_django_queue_action")
WORKERS = reverse("admin:axa_django_liveworker_changelist")
WORKERS_DATA = reverse("admin:axa_django_liveworker_data")
STOP = reverse("admin:axa_django_liveworker_stop")
HOSTILE = "<script>alert('q')</script>\"&"
ESCAPED = "&lt;script&gt;alert(&#x27;q&#x27;)&lt;/script&gt;&quot;&amp;"


def user_with(*codenames: str) -> Client:
    """A logged-in staff client holding exactly these axa_django permissions."""
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:8]}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="axa_django", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def sql_one(query: str, params: Any = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


def add_rows(queue: str, status: str, n: int, **fields: str) -> None:
    """``n`` rows of ``queue`` written as SQL writes them; ``fields``: column -> SQL expression."""
    columns = ", ".join(["id", "name", "args", "queue", "status", *fields])
    values = ", ".join(["gen_random_uuid()", "'ops.sleep'", "'{}'", "%s", "%s", *fields.values()])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO axa_queue ({columns}) SELECT {values} FROM generate_series(1, %s)", [queue, status, n]
        )


def add_worker(queues: list[str], *, host: str = "web-1", age: float = 0.0, lease: float = 30.0, **extra: Any) -> str:
    """A worker row as runworker registers it, its last heartbeat ``age`` seconds ago."""
    worker = str(uuid.uuid4())
    params = {
        "worker": worker,
        "hostname": host,
        "pid": extra.get("pid", 4242),
        "concurrency": extra.get("concurrency", 4),
        "queues": json.dumps(queues),
        "names": json.dumps(extra.get("names", ["ops.sleep", "ops.boom"])),
        "backends": json.dumps(extra.get("backends", [])),
        "lease": lease,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql.REGISTER, params)
        # Started in the order made (one transaction's now() would tie them), an hour ago.
        cursor.execute(
            "UPDATE axa_worker SET heartbeat_at = now() - make_interval(secs => %s), "
            "started_at = now() - interval '1 hour' + (SELECT count(*) FROM axa_worker) * interval '1 second' "
            "WHERE id = %s",
            [age, worker],
        )
    return worker


def row_of(html: str, attribute: str, value: str) -> str:
    found = re.search(rf'<tr {attribute}="{re.escape(value)}">.*?</tr>', html, re.S)
    assert found, f"no row {attribute}={value!r}"
    return found.group(0)


def cell(row: str, cls: str) -> str:
    found = re.search(rf'<td class="[^"]*\b{cls}\b[^"]*"[^>]*>(.*?)</td>', row, re.S)
    assert found, f"no cell {cls}"
    return found.group(1).strip()


# The Queues page.


@pytest.mark.django_db
def test_the_queues_page_shows_each_queues_figures_as_sql_counts_them(admin_client: Client) -> None:
    add_rows("mail", "queued", 3, run_at="now() - interval '90 seconds'")
    add_rows("mail", "queued", 2, run_at="now() + interval '1 hour'")
    live = add_worker(["mail"])
    add_rows("mail", "running", 1, worker_id=f"'{live}'", started_at="now()")
    add_rows(
        "mail", "completed", 4, finished_at="now() - interval '1 minute'", started_at="now() - interval '2 minutes'"
    )
    add_rows("mail", "failed", 1, finished_at="now() - interval '2 minutes'", started_at="now() - interval '3 minutes'")
    add_rows("mail", "completed", 7, finished_at="now() - interval '10 minutes'")  # outside the window
    add_worker([], host="all-queues")
    add_worker(["other"], host="other-only")
    add_worker([], host="dead", age=31.0)  # its lease (30 s) ran out: serves nothing
    QueuePause.objects.create(queue="mail", reason="provider outage\nsee #ops", paused_by="ann")
    QueueLimit.objects.create(queue="capped", max_running=3, set_by="bob")

    data = admin_client.get(QUEUES_DATA).json()
    queues = {q["queue"]: q for q in data["queues"]}
    # Every queue with rows, a pause or limit, a live worker, a registered job or a task backend's QUEUES.
    assert {"mail", "capped", "other", "default", "emails", "reports"} <= set(queues)
    mail = queues["mail"]
    expected = {
        "ready": "SELECT count(*) FROM axa_queue WHERE queue = 'mail' AND status = 'queued' AND run_at <= now()",
        "scheduled": "SELECT count(*) FROM axa_queue WHERE queue = 'mail' AND status = 'queued' AND run_at > now()",
        "running": "SELECT count(*) FROM axa_queue WHERE queue = 'mail' AND status = 'running'",
        "completed": "SELECT count(*) FROM axa_queue WHERE queue = 'mail' AND status = 'completed' "
        "AND finished_at >= now() - interval '5 minutes'",
        "failed": "SELECT count(*) FROM axa_queue WHERE queue = 'mail' AND status = 'failed' "
        "AND finished_at >= now() - interval '5 minutes'",
    }
    for figure, query in expected.items():
        assert mail[figure] == sql_one(query), figure
    assert (mail["ready"], mail["scheduled"], mail["running"], mail["completed"], mail["failed"]) == (3, 2, 1, 4, 1)
    oldest = sql_one(
        "SELECT extract(epoch FROM now() - min(run_at)) FROM axa_queue WHERE queue = 'mail' AND status = 'queued' AND run_at <= now()"
    )
    assert mail["oldest_ready_seconds"] == pytest.approx(float(oldest)) and mail["shown"]["oldest"] == "1 min 30 s"
    assert mail["per_minute"] == pytest.approx(5 / 5) and mail["shown"]["per_minute"] == "1.0"
    serving = "SELECT count(*) FROM axa_worker WHERE heartbeat_at >= now() - make_interval(secs => lease_seconds) AND (queues = '[]' OR queues ? %s)"
    for name in ("mail", "other", "capped"):
        assert len(queues[name]["workers"]) == sql_one(serving, [name]), name
    assert sorted(queues["mail"]["workers"]) == ["all-queues:4242", "web-1:4242"]
    assert (mail["paused"], mail["paused_by"], mail["reason"]) == (True, "ann", "provider outage\nsee #ops")
    assert mail["shown"]["paused"].startswith("by ann, ") and mail["shown"]["paused"].endswith(
        ": provider outage see #ops"
    )
    assert (queues["capped"]["max_running"], queues["capped"]["shown"]["limit"]) == (3, "at most 3 running")
    assert queues["capped"]["shown"]["limit_title"] == "set by bob" and not queues["capped"]["paused"]
    assert data["span"] == "the last 5 minutes" and not data["span_capped"]

    # The page shows the same cells, with the controls for a user who may use them.
    html = admin_client.get(QUEUES).content.decode()
    row = row_of(html, "data-queue", "mail")
    shown = mail["shown"]
    for cls, key in [("axa-q-ready", "ready"), ("axa-q-scheduled", "scheduled"), ("axa-q-running", "running"),
                     ("axa-q-oldest", "oldest"), ("axa-q-per-minute", "per_minute"), ("axa-q-failed", "failed"),
                     ("axa-q-workers", "workers")]:  # fmt: skip
        assert cell(row, cls) == shown[key], cls
    assert "axa-badge axa-paused" in row and 'value="resume"' in row and 'data-do="pause"' not in row
    capped = row_of(html, "data-queue", "capped")
    assert (
        'data-do="pause"' in capped
        and 'value="unlimit"' in capped
        and cell(capped, "axa-q-limit") == "at most 3 running"
    )
    assert 'id="axa-pause-form"' in html and 'id="axa-limit-form"' in html
    # A queue's name links to its jobs.
    assert f'href="{reverse("admin:axa_django_job_changelist")}?queue=mail"' in row
    listed = admin_client.get(reverse("admin:axa_django_job_changelist"), {"queue": "mail"})
    assert listed.status_code == 200 and {job.queue for job in listed.context["cl"].result_list} == {"mail"}


@pytest.mark.django_db
def test_counts_past_the_cap_say_at_least_and_a_capped_throughput_says_its_span(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleetview, "CAP", 3)
    monkeypatch.setattr(fleetview, "THROUGHPUT_CAP", 4)
    add_rows("big", "queued", 5, run_at="now() - interval '1 second'")
    add_rows("big", "completed", 6, finished_at="now() - interval '1 minute'")
    add_rows("big", "completed", 2, finished_at="now() - interval '30 seconds'")
    data = admin_client.get(QUEUES_DATA).json()
    (big,) = [q for q in data["queues"] if q["queue"] == "big"]
    assert big["shown"]["ready"] == "at least 3" and big["ready_capped"]
    # The newest 4 finished rows span 60 s: 4 in 60 s is 4 a minute.
    newest = sql_one(
        "SELECT extract(epoch FROM now() - min(finished_at)) FROM (SELECT finished_at FROM axa_queue "
        "WHERE queue = 'big' AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 4) AS n"
    )
    assert data["span_capped"] and data["span_seconds"] == pytest.approx(float(newest))
    assert big["completed"] == 4 and big["per_minute"] == pytest.approx(4 * 60 / float(newest))
    assert data["span"] == "the last 1 min 0 s (the newest 4 finished jobs)"


@pytest.mark.django_db
def test_queue_controls_need_pause_queue_and_each_is_logged_and_kept_in_the_history(
    caplog: pytest.LogCaptureFixture,
) -> None:
    viewer = user_with("view_job")
    html = viewer.get(QUEUES).content.decode()
    assert "<th>Actions</th>" not in html and 'id="axa-pause-form"' not in html and 'id="axa-csrf"' not in html
    assert viewer.post(ACTION, {"do": "pause", "queue": "mail"}).status_code == 403
    assert user_with().get(QUEUES).status_code == 403
    assert user_with().get(QUEUES_DATA).status_code == 403
    assert user_with("view_queuepause").get(QUEUES).status_code == 200

    operator = user_with("pause_queue")
    assert operator.get(ACTION).status_code == 405
    assert operator.post(QUEUES_DATA).status_code == 405
    steps = [
        ({"do": "pause", "queue": "mail", "reason": "provider <down>"}, "Queue 'mail' paused", "Paused (reason: 'provider <down>')."),
        ({"do": "pause", "queue": "mail", "reason": "still down"}, "already paused", "Pause reason updated (reason: 'still down')."),
        ({"do": "limit", "queue": "mail", "max_running": "3"}, "at most 3 of its jobs", "Limit set to 3 running (it had no limit)."),
        ({"do": "limit", "queue": "mail", "max_running": "5"}, "(it was 3)", "Limit set to 5 running (it was 3)."),
        ({"do": "unlimit", "queue": "mail"}, "its limit of 5 running is lifted", "Limit of 5 running lifted."),
        ({"do": "resume", "queue": "mail"}, "Queue 'mail' resumed", "Resumed."),
    ]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="axa_django"):
        for data, said, history in steps:
            response = operator.post(ACTION, data, follow=True)
            assert response.redirect_chain == [(QUEUES, 302)]
            assert any(said in m for m in messages_of(response)), (said, messages_of(response))
            entry = LogEntry.objects.order_by("-action_time", "-id").first()
            assert entry.get_change_message() == history and entry.object_id == "mail" and entry.object_repr == "mail"
            assert entry.content_type == ContentType.objects.get_for_model(Queue, for_concrete_model=False)
            if data["do"] == "pause":
                assert QueuePause.objects.get(queue="mail").reason == data["reason"]
    username = operator.session.get("_auth_user_id")
    who = User.objects.get(pk=username).username
    lines = [r.getMessage() for r in caplog.records if r.name == "axa_django" and r.levelno == logging.INFO]
    assert len(lines) == len(steps) and all(f"from the admin by {who} (1 queue)" in line for line in lines), lines
    assert not QueuePause.objects.exists() and not QueueLimit.objects.exists()
    assert QueuePause.objects.model._meta.db_table == "axa_paused_queue"

    # The admin's index lists the changes among its recent actions.
    assert operator.get(reverse("admin:index")).status_code == 200
    # Without the CSRF token a control is refused, whatever the permission.
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(User.objects.get(pk=operator.session["_auth_user_id"]))
    assert guarded.post(ACTION, {"do": "pause", "queue": "mail"}).status_code == 403
    assert not QueuePause.objects.exists()

    # Nothing to do: said so, nothing written, nothing logged.
    for data in ({"do": "resume", "queue": "mail"}, {"do": "unlimit", "queue": "mail"}):
        response = operator.post(ACTION, data, follow=True)
        assert "nothing changed" in messages_of(response)[0]
    assert LogEntry.objects.count() == len(steps)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"do": "pause", "queue": ""}, "Queue: This field is required."),
        ({"do": "pause", "queue": " mail"}, "Queue: a queue name cannot start or end with whitespace"),
        ({"do": "pause", "queue": "a\tb"}, "Queue: a queue name cannot contain control characters"),
        ({"do": "pause", "queue": "mail", "reason": "x" * 1001}, "Reason: reason is 1001 characters long"),
        ({"do": "limit", "queue": "mail"}, "At most running: Give how many of the queue"),
        ({"do": "limit", "queue": "mail", "max_running": "0"}, "At most running: Ensure this value is greater than or equal to 1."),
        ({"do": "limit", "queue": "mail", "max_running": "many"}, "At most running: Enter a whole number."),
        ({"do": "limit", "queue": "mail", "max_running": str(2**31)}, "At most running: Ensure this value is less than or equal to 2147483647."),
        ({"do": "drop", "queue": "mail"}, "Action: Select a valid choice. drop is not one of the available choices."),
    ],
)  # fmt: skip
def test_bad_input_gets_a_message_on_the_page_and_changes_nothing(
    admin_client: Client, data: dict[str, str], said: str
) -> None:
    response = admin_client.post(ACTION, data)
    assert response.status_code == 400
    assert any(error.startswith(said) for error in response.context["form_errors"]), response.context["form_errors"]
    assert 'id="axa-form-errors"' in response.content.decode()
    assert not QueuePause.objects.exists() and not QueueLimit.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
def test_a_nul_in_any_parameter_is_a_400(admin_client: Client) -> None:
    assert admin_client.post(ACTION, {"do": "pause", "queue": "ma\x00il"}).status_code == 400
    assert admin_client.post(ACTION, {"do": "pause", "queue": "mail", "reason": "\x00"}).status_code == 400
    assert admin_client.get(QUEUES, {"queue": "\x00"}).status_code == 400
    assert admin_client.get(WORKERS, {"refresh": "\x00"}).status_code == 400
    assert admin_client.get(QUEUES_DATA, {"x": "\x00"}).status_code == 400
    assert admin_client.get(WORKERS_DATA, {"x": "\x00"}).status_code == 400
    assert admin_client.post(STOP, {"worker": "\x00"}).status_code == 400
    assert not QueuePause.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
def test_what_rows_hold_is_escaped_on_both_pages(admin_client: Client) -> None:
    worker = add_worker([HOSTILE], host=HOSTILE, names=[HOSTILE])
    add_rows(HOSTILE, "running", 1, worker_id=f"'{worker}'", started_at="now()")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET name = %s", [HOSTILE])
    QueuePause.objects.create(queue=HOSTILE, reason=HOSTILE, paused_by=HOSTILE)
    for url in (QUEUES, WORKERS):
        html = admin_client.get(url).content.decode()
        assert HOSTILE not in html and ESCAPED in html, url
    data = admin_client.get(WORKERS_DATA).json()
    assert data["workers"][0]["shown"]["jobs"][0]["name"] == HOSTILE  # data in JSON; the page's script sets it as text


# The Workers page.


@pytest.mark.django_db
def test_the_workers_page_lists_live_workers_and_what_each_thread_runs(admin_client: Client) -> None:
    busy = add_worker(
        ["mail", "default"], host="web-1", concurrency=2, names=["a", "b", "c", "d", "e"], backends=["tasks"]
    )
    idle = add_worker([], host="web-2", age=20.0)
    dead = add_worker([], host="gone", age=40.0)
    add_rows("mail", "running", 1, worker_id=f"'{busy}'", started_at="now() - interval '75 seconds'", attempts="2")
    add_rows("mail", "running", 1, worker_id=f"'{busy}'", started_at="now() - interval '2 seconds'", attempts="1")
    add_rows("mail", "running", 1, worker_id=f"'{busy}'")  # claimed ahead: no thread yet
    add_rows("mail", "running", 1, worker_id=f"'{dead}'", started_at="now()")  # a dead worker's: not listed

    data = admin_client.get(WORKERS_DATA).json()
    assert [w["id"] for w in data["workers"]] == [busy, idle]
    live = "SELECT count(*) FROM axa_worker WHERE heartbeat_at >= now() - make_interval(secs => lease_seconds)"
    assert len(data["workers"]) == sql_one(live) and data["dead"] == sql_one(
        "SELECT count(*) FROM axa_worker"
    ) - sql_one(live)
    first = data["workers"][0]
    running = "SELECT count(*), count(started_at) FROM axa_queue WHERE status = 'running' AND worker_id = %s"
    with connection.cursor() as cursor:
        cursor.execute(running, [busy])
        assert (first["running"], first["busy"]) == cursor.fetchone() == (3, 2)
    shown = first["shown"]
    assert (shown["label"], shown["queues"], shown["busy"], shown["waiting"]) == (
        "web-1:4242",
        "mail, default",
        "2 of 2",
        "1",
    )
    assert (
        shown["runs"] == "5 job names; task backends tasks"
        and shown["runs_title"] == "a\nb\nc\nd\ne\ntask backend tasks"
    )
    jobs = Job.objects.filter(worker_id=busy).order_by("started_at")
    listed = [(j["id"], j["attempt"], j["running"]) for j in shown["jobs"]]
    assert listed == [(str(jobs[0].pk), 2, "1 min 15 s"), (str(jobs[1].pk), 1, "2.0 s"),
                      (str(jobs[2].pk), 0, "claimed ahead, waiting for a thread")]  # fmt: skip
    assert shown["jobs"][0]["url"] == reverse("admin:axa_django_job_change", args=[jobs[0].pk])
    assert data["workers"][1]["shown"]["heartbeat"] == "20.0 s ago" and data["workers"][1]["shown"]["jobs"] == []
    threads = sql_one(
        "SELECT sum(concurrency) FROM axa_worker WHERE heartbeat_at >= now() - make_interval(secs => lease_seconds)"
    )
    busy_threads = sql_one(
        "SELECT count(started_at) FROM axa_queue WHERE status = 'running' AND worker_id IN (%s, %s)", [busy, idle]
    )
    assert (
        data["summary"]
        == f"2 live workers, {threads} threads, {busy_threads} busy."
        == "2 live workers, 6 threads, 2 busy."
    )

    html = admin_client.get(WORKERS).content.decode()
    row = row_of(html, "data-worker", busy)
    assert cell(row, "axa-w-busy") == "2 of 2" and cell(row, "axa-w-waiting") == "1"
    assert f'<a href="{shown["jobs"][0]["url"]}">ops.sleep</a>' in row and "attempt 2" in row
    assert 'name="worker"' in row and dead not in html and "gone:4242" not in html
    assert re.search(r'id="axa-dead-count">1<', html)


@pytest.mark.django_db
def test_worker_rows_with_any_lease_show_on_every_page_that_reads_the_fleet(admin_client: Client) -> None:
    # A lease written by hand as 1e12 s or Infinity put now() minus it out of range: the
    # Workers and Queues pages, the stop, the bulk confirmation and the periodic page failed.
    leases = (1e12, float("inf"), float("nan"))
    live = {str(lease): add_worker([], host=f"h{lease}", lease=lease, names=[bulkjob.NAME]) for lease in leases}
    add_worker([], host="no lease", lease=-1e12)
    data = admin_client.get(WORKERS_DATA).json()
    assert sorted(w["id"] for w in data["workers"]) == sorted(live.values()) and data["dead"] == 1
    assert admin_client.get(QUEUES_DATA).status_code == 200
    assert fleetview.request_stop(live["inf"], "ann").outcome == "asked"
    assert bulk.served() == ""  # they serve every queue and the bulk operation's name
    with connection.cursor() as cursor:
        cursor.execute(periodic.LIVE)
        assert len(cursor.fetchall()) == 3


@pytest.mark.django_db
def test_a_stop_needs_stop_worker_and_says_why_when_nothing_is_asked(caplog: pytest.LogCaptureFixture) -> None:
    live = add_worker([], host="web-1")
    dead = add_worker([], host="web-9", age=45.0)
    viewer = user_with("view_job")
    html = viewer.get(WORKERS).content.decode()
    assert 'name="worker"' not in html and "<th>Action</th>" not in html
    assert viewer.post(STOP, {"worker": live}).status_code == 403
    assert user_with().get(WORKERS).status_code == 403 and user_with().get(WORKERS_DATA).status_code == 403

    stopper = user_with("stop_worker")
    assert stopper.get(STOP).status_code == 405
    who = User.objects.get(pk=stopper.session["_auth_user_id"]).username
    with caplog.at_level(logging.INFO, logger="axa_django"):
        response = stopper.post(STOP, {"worker": live}, follow=True)
    assert response.redirect_chain == [(WORKERS, 302)]
    assert messages_of(response) == [
        "Worker web-1:4242 was asked to stop: at its next heartbeat it claims no more jobs, finishes those it runs and exits."
    ]
    row = Worker.objects.get(pk=live)
    assert row.stop_requested_by == who and row.stop_requested_at is not None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        f"worker {live} (web-1:4242): asked to stop from the admin by {who} (1 worker)"
    ]
    entry = LogEntry.objects.get()
    assert (entry.object_id, entry.object_repr, entry.get_change_message()) == (live, "web-1:4242", "Asked to stop.")
    assert entry.content_type == ContentType.objects.get_for_model(LiveWorker, for_concrete_model=False)
    # The page says it is stopping, and offers no second stop.
    page = row_of(stopper.get(WORKERS).content.decode(), "data-worker", live)
    assert cell(page, "axa-w-state").startswith(f'<span class="axa-stale">stopping</span> asked by {who} ')
    assert 'name="worker"' not in page

    for posted, said in [
        (live, f"Worker web-1:4242 was already asked to stop (by {who})"),
        (dead, "Worker web-9:4242 was not asked to stop: its lease has run out"),
        (str(uuid.uuid4()), "That worker is no longer running: nothing to stop."),
        ("not-an-id", "No worker was asked to stop: the request named none."),
    ]:
        assert messages_of(stopper.post(STOP, {"worker": posted}, follow=True))[0].startswith(said)
    assert LogEntry.objects.count() == 1 and Worker.objects.get(pk=dead).stop_requested_by is None
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(User.objects.get(pk=stopper.session["_auth_user_id"]))
    assert guarded.post(STOP, {"worker": str(dead)}).status_code == 403


# The stop request meets the heartbeat on the worker's row.


@pytest.fixture
def actors() -> Iterator[tuple[Actor, Actor]]:
    made = (Actor("A"), Actor("B"))
    for actor in made:
        actor.ready()
    yield made
    for actor in made:
        actor.close()


def _beat(actor: Actor, worker: uuid.UUID) -> Any:
    row = actor.worker_conn.execute(sql.HEARTBEAT, {"worker": worker, "ids": [], "elect": False}).fetchone()
    return row[0], row[3]


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("first", ["stop", "beat"])
def test_a_stop_request_and_a_heartbeat_on_one_worker_row_both_land(actors: tuple[Actor, Actor], first: str) -> None:
    a, b = actors
    worker = uuid.uuid4()
    with connect("default", "race setup") as setup:
        register(setup, worker, ["ops.sleep"])

    def stop(actor: Actor, _: Any) -> Any:
        return fleetview.request_stop(str(worker), "ann").outcome

    def beat(actor: Actor, _: Any) -> Any:
        return _beat(actor, worker)

    moves = {"stop": stop, "beat": beat}
    second = "beat" if first == "stop" else "stop"
    a.begin()
    held = a.call(moves[first], a, None)
    (ran,) = run_into(a, [(b, _Move(second, moves[second]))], None, waits=True, commit=True)  # type: ignore[arg-type]
    assert ran.waited and ran.error is None, ran
    if first == "stop":
        # The beat waited for the request, then read it back: the worker stops at this beat.
        assert held == "asked" and ran.value == (1, "ann")
    else:
        # The request waited for the beat, then landed: the next beat reads it back.
        assert held == (1, None) and ran.value == "asked"
        assert b.call(beat, b, None) == (1, "ann")
    row = sql_row(
        "SELECT stop_requested_by, heartbeat_at >= now() - interval '5 seconds' FROM axa_worker WHERE id = %s", [worker]
    )
    assert row == ("ann", True)


class _Move:
    """A statement for ``run_into`` (tests/races.py), named for its messages."""

    def __init__(self, label: str, run: Any) -> None:
        self.label, self.run = label, run

    def __str__(self) -> str:
        return self.label


def sql_row(query: str, params: Any) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("stopping", [False, True])
def test_a_beat_that_finds_no_row_registers_again_unless_the_worker_is_stopping(tmp_path: Any, stopping: bool) -> None:
    # A stopping worker's shutdown deletes its row; a beat meeting it found no row and
    # registered the exited worker again, live-looking for a lease (seen on the Workers page).
    health = tmp_path / "beat"
    control = Control()
    if stopping:
        control.stop()
    beat = Heartbeat(Options.build(health_file=str(health)), uuid.uuid4(), control, Ledger())
    thread = threading.Thread(target=beat.loop, daemon=True)
    thread.start()
    wait_for(health.exists, 10, "the heartbeat to start")
    # Touched after each beat; the first touch creates the file and then sets its time, so one
    # change may be that touch's own: two changes make sure a beat came.
    for _ in range(2):
        started = health.stat().st_mtime_ns
        wait_for(lambda started=started: health.stat().st_mtime_ns != started, 10, "a beat")
    control.done.set()
    thread.join(timeout=10)
    assert Worker.objects.filter(pk=beat.worker_id).exists() is not stopping


# Real workers asked to stop from the page.


class Output:
    """A worker's output read on a thread of its own, each line with the time it came."""

    def __init__(self, proc: Any) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: Any) -> None:
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def find(self, text: str) -> float | None:
        return next((at for at, line in self.lines if text in line), None)

    def __str__(self) -> str:
        return "\n".join(line for _, line in self.lines)


@pytest.mark.django_db(transaction=True)
def test_a_worker_asked_to_stop_from_the_page_finishes_its_job_and_exits(
    admin_client: Client, workers: Workers
) -> None:
    env = workers.env(AXA_LOG_LEVEL="INFO")
    plain = workers.start("--concurrency", "2", "--queue", "default", env=env)
    # Per-queue pools, on a longer lease: a beat every 2 s.
    pools = workers.start("--queue", "emails:1", "--queue", "reports:1", env={**env, "AXA_TEST_LEASE": "6"})
    plain_out, pools_out = Output(plain), Output(pools)
    job = ops_jobs.nap.perform_later(1.5)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", what="the nap to start")
    try:
        wait_for(lambda: Worker.objects.count() == 3, what="three worker rows")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{plain_out}\n{pools_out}") from None
    plain_row = Worker.objects.get(queues=["default"])

    response = admin_client.post(STOP, {"worker": str(plain_row.pk)}, follow=True)
    assert "was asked to stop" in messages_of(response)[0], f"{messages_of(response)}\n{plain_out}"
    wait_for(lambda: plain_out.find("admin asked it to stop from the admin"), 10, "the worker to log the stop")
    assert plain.wait(timeout=30) == 0, plain_out
    said = f"worker {plain_row.pk}: admin asked it to stop from the admin; finishing jobs in progress"
    assert plain_out.find(said) is not None, plain_out
    assert Job.objects.get(pk=job.pk).status == "completed", plain_out  # it finished the job it ran, then exited
    assert not Worker.objects.filter(pk=plain_row.pk).exists()

    # A pool whose last beat is older (its lease not yet out): asked, it stops within one beat, and its process with it.
    pool_row = Worker.objects.get(queues=["emails"])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_worker SET heartbeat_at = now() - interval '3 seconds' WHERE id = %s", [pool_row.pk])
    said = messages_of(admin_client.post(STOP, {"worker": str(pool_row.pk)}, follow=True))
    assert "was asked to stop" in said[0], f"{said}\n{pools_out}"
    # The first beat after the request reads it: the row is seen beaten at most once before the
    # worker says so. (Counted in beats, not seconds: a loaded machine stretches the seconds.)
    beats: set[Any] = set()

    def stop_seen() -> bool:
        row = Worker.objects.filter(pk=pool_row.pk).values_list("heartbeat_at", "stop_requested_at").first()
        if row is not None and row[0] > row[1]:
            beats.add(row[0])  # a beat after the request
        return pools_out.find(f"worker {pool_row.pk}: admin asked") is not None

    wait_for(stop_seen, 10, "the pool to log the stop")
    assert len(beats) <= 1, f"{sorted(beats)}: beaten more than once after the request before it stopped"
    assert pools.wait(timeout=30) == 0, pools_out
    assert not Worker.objects.exists(), f"{list(Worker.objects.values())}\n{plain_out}\n{pools_out}"
