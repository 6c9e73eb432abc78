"""The example project: its page enqueues jobs, `manage.py demo` drains or serves them, its checks pass."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from axa_django import Job, registry
from axa_django.worker import Worker
from tests.conftest import ROOT, Workers, wait_for

SUMMARY = re.compile(r"^demo: (\d+) jobs, (\d+) completed, (\d+) failed in ([\d.]+)s", re.MULTILINE)
WELCOME = "example_project.shop.jobs.send_welcome_email"
CHARGE = "example_project.shop.jobs.charge_card"


def example_env(workers: Workers, **extra: str) -> dict[str, str]:
    """Environment for a manage.py of the example on the test database."""
    return workers.env(DJANGO_SETTINGS_MODULE="example_project.settings", **extra)


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def shop(settings) -> Iterator[Client]:
    """The test settings plus the example's app and URLs; its jobs are registered only meanwhile."""
    saved = dict(registry.registry)
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "example_project.shop"]
    settings.ROOT_URLCONF = "example_project.urls"
    from example_project.shop import jobs

    for job in (jobs.send_welcome_email, jobs.charge_card):
        registry.registry[job.name] = job
    yield Client(enforce_csrf_checks=True)
    registry.registry.clear()
    registry.registry.update(saved)


def csrf_token(client: Client) -> str:
    page = client.get("/")
    assert page.status_code == 200
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match, "the form has no CSRF token"
    return match.group(1)


# -- the page --------------------------------------------------------------------


@pytest.mark.django_db
def test_form_enqueues_jobs(shop):
    token = csrf_token(shop)
    response = shop.post("/", {"csrfmiddlewaretoken": token, "kind": "welcome", "count": "5"})
    assert response.status_code == 302
    jobs = list(Job.objects.all())
    assert len(jobs) == 5
    assert {job.name for job in jobs} == {WELCOME}
    assert {job.status for job in jobs} == {"queued"}
    for job in jobs:
        assert set(job.args) == {"user_id", "email"}
        assert job.args["email"] == f"customer{job.args['user_id']}@example.com"

    response = shop.post("/", {"csrfmiddlewaretoken": token, "kind": "charge", "count": "3"})
    assert response.status_code == 302
    charges = Job.objects.filter(name=CHARGE)
    assert charges.count() == 3
    assert {job.max_attempts for job in charges} == {3}

    page = shop.get(response["Location"]).content.decode()
    assert "Enqueued 3 charge_card jobs" in page
    assert page.count('class="status queued"') == 8
    assert "Queued: <strong>8</strong>" in page


@pytest.mark.django_db
def test_form_rejects_bad_input_and_writes_nothing(shop):
    token = csrf_token(shop)
    for data in (
        {"kind": "welcome", "count": "0"},
        {"kind": "welcome", "count": "1001"},
        {"kind": "welcome", "count": "many"},
        {"kind": "delete_everything", "count": "1"},
    ):
        response = shop.post("/", {"csrfmiddlewaretoken": token, **data})
        assert response.status_code == 200, data
        assert 'class="errorlist' in response.content.decode(), data
    # Without the CSRF token the POST is refused.
    assert shop.post("/", {"kind": "welcome", "count": "1"}).status_code == 403
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_page_shows_what_the_worker_did(shop):
    token = csrf_token(shop)
    assert shop.post("/", {"csrfmiddlewaretoken": token, "kind": "welcome", "count": "4"}).status_code == 302
    assert shop.post("/", {"csrfmiddlewaretoken": token, "kind": "charge", "count": "6"}).status_code == 302
    assert Worker(concurrency=2, burst=True, install_signals=False).run() == 0

    assert set(Job.objects.filter(name=WELCOME).values_list("status", flat=True)) == {"completed"}
    charges = Job.objects.filter(name=CHARGE)
    assert set(charges.values_list("status", flat=True)) <= {"completed", "failed"}
    for job in charges:  # retried at once until it succeeds or runs out of its 3 attempts
        assert job.attempts == (3 if job.status == "failed" else len(job.errors) + 1)

    table = shop.get("/jobs/").content.decode()
    assert table.count("<tr>") == 1 + 10
    completed = Job.objects.filter(status="completed").count()
    assert f"Completed: <strong>{completed}</strong>" in table
    assert "&quot;subject&quot;: &quot;Welcome!&quot;" in table  # a welcome job's result
    if charges.filter(status="failed").exists():
        assert "PaymentGatewayError: gateway timed out" in table


# -- manage.py demo --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_demo_burst_drains_its_sample(workers):
    result = manage("demo", "--burst", "--jobs", "60", env=example_env(workers))
    assert result.returncode == 0, result.stdout + result.stderr
    match = SUMMARY.search(result.stdout)
    assert match, result.stdout
    total, completed, failed = (int(n) for n in match.groups()[:3])
    assert total == 60
    assert completed + failed == total
    assert completed >= 30  # the 30 welcome emails always succeed

    assert Job.objects.count() == 60
    assert Job.objects.filter(status="completed").count() == completed
    assert Job.objects.filter(status="failed").count() == failed
    assert set(Job.objects.filter(name=WELCOME).values_list("status", flat=True)) == {"completed"}
    assert Job.objects.filter(name=CHARGE).count() == 30
    assert not Job.objects.filter(status="failed").exclude(attempts=3).exists()
    assert not get_user_model().objects.exists()  # no web server, so no admin user


@pytest.mark.django_db(transaction=True)
def test_demo_serves_the_site_and_stops_on_ctrl_c(workers, tmp_path):
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "demo", "--jobs", "10", "--port", str(port)],
            cwd=ROOT,
            env=example_env(workers),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so that a failed check can stop its children too
        )
    workers.procs.append(demo)  # killed at teardown if a check below fails

    def page() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None

    try:
        assert "axa-django example shop" in wait_for(page, 60, "the development server")
        wait_for(
            lambda: Job.objects.filter(status__in=["completed", "failed"]).count() == 10,
            60,
            "the worker to run the sample",
        )
        assert "Completed: <strong>0</strong>" not in page()
        password = re.search(r"admin user 'admin' \(created\), password '([^']+)'", log.read_text())
        assert password, log.read_text()
        assert get_user_model().objects.get(username="admin").check_password(password.group(1))

        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0, log.read_text()
    except BaseException:
        # Its worker and web server would otherwise live on, and take later tests' jobs.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)
        raise
    text = log.read_text()
    assert re.search(r"worker \S+ stopped after \d+ attempts?", text), text
    assert "demo: stopped" in text
    assert page() is None  # the development server is gone too


@pytest.mark.django_db(transaction=True)
def test_demo_reports_a_busy_port(workers):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = manage("demo", "--jobs", "0", "--port", str(port), env=example_env(workers))
    assert result.returncode == 1
    assert f"the development server stopped by itself (is port {port} in use? try --port)" in result.stderr
    output = result.stdout + result.stderr
    # The worker may get the SIGTERM while Django is still loading (a busy machine): then it
    # never started. If it started, it stopped cleanly.
    assert re.search(r"worker \S+ stopped after", output) or "starting:" not in output, output


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: pytest sessions running beside this one chmod its shared
    # root back to 0700, which locks out the embedded server's own (non-root) user.
    path = Path(tempfile.mkdtemp(prefix="axa-example-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_demo_on_a_bare_machine_starts_and_stops_its_own_database(workers, data_dir):
    """No DATABASE_URL: the example starts an embedded PostgreSQL in its data folder, then stops it."""
    env = example_env(workers, EXAMPLE_DATA_DIR=str(data_dir))
    del env["DATABASE_URL"]
    result = manage("demo", "--burst", "--jobs", "20", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    match = SUMMARY.search(result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) == 20
    assert int(match.group(2)) + int(match.group(3)) == 20
    pgdata = data_dir / "pg"
    assert (pgdata / "PG_VERSION").exists()
    assert not (pgdata / "postmaster.pid").exists(), "the embedded server is still running"


@pytest.mark.django_db
def test_example_checks_and_migrations_are_clean(workers):
    env = example_env(workers)
    del env["DJANGO_SETTINGS_MODULE"]  # manage.py defaults to example_project.settings
    check = manage("check", "--fail-level", "WARNING", env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "System check identified no issues" in check.stdout
    migrations = manage("makemigrations", "--check", "--dry-run", env=env)
    assert migrations.returncode == 0, migrations.stdout + migrations.stderr
    bad = manage("demo", "--burst", "--concurrency", "0", env=env)
    assert bad.returncode == 2
    assert "argument --concurrency: must be at least 1, got 0" in bad.stderr
