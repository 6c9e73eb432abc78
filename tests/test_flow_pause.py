"""Paused queues: skipped in the claim by every worker, listed by `manage.py queues`, resumed with a wake-up."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from axa_django import queues
from axa_django.models import Job, QueuePause
from axa_django.worker import Worker
from tests.conftest import wait_for
from tests.testapp import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def burst(**options: object) -> Worker:
    worker = Worker(burst=True, install_signals=False, concurrency=2, **options)
    assert worker.run() == 0
    return worker


def status(job: Job) -> str:
    job.refresh_from_db()
    return job.status


@pytest.mark.parametrize("queue_worker", [False, True])
def test_a_paused_queue_is_not_claimed_and_runs_once_resumed(queue_worker: bool) -> None:
    held = flow_jobs.email.perform_later("held")
    other = flow_jobs.chore.perform_later("other")
    assert queues.pause("flow-emails", "smtp down") is True
    options = {"queues": ["flow-emails", "flow-default"]} if queue_worker else {}
    assert burst(**options).processed == 1
    assert (status(held), status(other)) == ("queued", "completed")
    assert queues.resume("flow-emails") is True
    assert burst(**options).processed == 1
    assert status(held) == "completed"


def test_pause_and_resume_say_whether_they_changed_anything() -> None:
    assert queues.pause("flow-emails") is True
    assert queues.pause("flow-emails", "still down") is False
    assert QueuePause.objects.get(queue="flow-emails").reason == "still down"
    assert queues.resume("flow-emails") is True
    assert queues.resume("flow-emails") is False
    assert not QueuePause.objects.exists()


def test_a_queue_name_that_looks_like_sql_or_a_slot_is_data() -> None:
    for name in ["x'); DELETE FROM axa_queue; --", "{queue_0}", "%(limit)s", "{paused}"]:
        job = flow_jobs.email.using(queue=name).perform_later("odd")
        queues.pause(name)
        assert burst(queues=[name]).processed == 0 and burst().processed == 0
        queues.resume(name)
        assert burst(queues=[name]).processed == 1 and status(job) == "completed"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: queues.pause(""), "cannot be empty"),
        (lambda: queues.pause(" emails"), "whitespace"),
        (lambda: queues.pause("a\nb"), "control characters"),
        (lambda: queues.pause(7), "must be a string"),
        (lambda: queues.pause("emails", "a\x00b"), "NUL"),
        (lambda: queues.pause("emails", None), "reason must be a str"),
        (lambda: queues.pause("emails", "x" * 1001), "keep it to 1000"),
        (lambda: queues.resume(""), "cannot be empty"),
    ],
)
def test_bad_input_is_refused_before_any_sql(call: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        call()  # type: ignore[operator]
    assert not QueuePause.objects.exists()


def test_manage_queues_lists_pauses_and_pauses_and_resumes(capsys: pytest.CaptureFixture[str]) -> None:
    flow_jobs.email.perform_later("a")
    flow_jobs.email.perform_later("b")
    call_command("queues", "pause", "flow-emails", "--reason", "incident\n42")
    call_command("queues")
    out = capsys.readouterr().out
    assert "queue 'flow-emails' paused" in out
    line = next(line for line in out.splitlines() if line.startswith("flow-emails"))
    assert line.split()[:3] == ["flow-emails", "2", "0"] and "paused (incident 42)" in line
    default = next(line for line in out.splitlines() if line.startswith("default "))
    assert "one_per_account: concurrency 1 per key" in default and "two_per_minute: rate 2/m" in default
    assert "sleepy: timeout 0.5s" in default
    call_command("queues", "resume", "flow-emails")
    call_command("queues", "resume", "flow-emails")
    out = capsys.readouterr().out
    assert "queue 'flow-emails' resumed" in out and "was not paused" in out


def test_manage_queues_refuses_a_bad_name(workers) -> None:
    done = workers.manage("queues", "pause", " x")
    assert done.returncode == 1 and "whitespace" in done.stderr


@pytest.mark.halved
def test_running_jobs_finish_no_new_claims_and_resume_wakes_an_idle_worker_at_once(workers, tmp_path) -> None:
    log = tmp_path / "log"
    running = flow_jobs.chore.perform_later("slow", str(log), seconds=1.0)
    # A poll every 60 s: only the resume's NOTIFY can wake the worker in time.
    proc = workers.start("--concurrency", "2", "--poll-interval", "60")
    wait_for(lambda: log.exists() and "start slow" in log.read_text(), what="the slow job to start")
    queues.pause("flow-default")
    held = flow_jobs.chore.perform_later("held", str(log))
    wait_for(lambda: status(running) == "completed", what="the running job to finish")
    other = flow_jobs.email.perform_later("other", str(log))
    wait_for(lambda: status(other) == "completed", what="another queue's job to run")
    assert status(held) == "queued"
    assert workers.manage("queues", "resume", "flow-default").returncode == 0
    wait_for(lambda: status(held) == "completed", timeout=20, what="the resumed queue's job to run")
    assert proc.poll() is None


def admin_user(*codenames: str) -> Client:
    client = Client()
    user = User.objects.create_user(f"u{uuid.uuid4().hex[:8]}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="axa_django", codename__in=codenames))
    client.force_login(user)
    return client


def test_admin_pauses_and_resumes_with_the_permission() -> None:
    client = admin_user("pause_queue")
    add = reverse("admin:axa_django_queuepause_add")
    response = client.post(add, {"queue": "flow-emails", "reason": "smtp down"})
    assert response.status_code == 302
    pause = QueuePause.objects.get()
    assert (pause.queue, pause.reason, pause.paused_by) == ("flow-emails", "smtp down", pause.paused_by)
    assert pause.paused_by.startswith("u")
    listing = client.get(reverse("admin:axa_django_queuepause_changelist")).content.decode()
    assert "flow-emails" in listing and "smtp down" in listing and "Resume selected queues" in listing
    bad = client.post(add, {"queue": "a\tb", "reason": ""})
    assert bad.status_code == 200 and "control characters" in bad.content.decode()
    response = client.post(
        reverse("admin:axa_django_queuepause_changelist"),
        {"action": "resume_queues", "_selected_action": ["flow-emails"]},
    )
    assert response.status_code == 302 and not QueuePause.objects.exists()


def test_admin_without_the_permission_cannot_pause_or_resume() -> None:
    queues.pause("flow-emails")
    viewer = admin_user("view_queuepause")
    changelist = reverse("admin:axa_django_queuepause_changelist")
    page = viewer.get(changelist).content.decode()
    assert "flow-emails" in page and "Resume selected queues" not in page
    assert viewer.get(reverse("admin:axa_django_queuepause_add")).status_code == 403
    viewer.post(changelist, {"action": "resume_queues", "_selected_action": ["flow-emails"]})
    assert QueuePause.objects.exists()
    assert admin_user().get(changelist).status_code == 403


def test_the_dashboard_lists_paused_queues() -> None:
    queues.pause("flow-emails", "smtp <down>")
    html = admin_user("view_job").get(reverse("admin:axa_django_queuedashboard_changelist")).content.decode()
    assert 'id="axa-paused"' in html and "flow-emails" in html and "smtp &lt;down&gt;" in html
    queues.resume("flow-emails")
    html = admin_user("view_job").get(reverse("admin:axa_django_queuedashboard_changelist")).content.decode()
    assert 'id="axa-paused"' not in html
