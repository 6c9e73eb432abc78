"""Which tasks framework QueueBackend serves: django.tasks on Django >= 6.0, the django-tasks
backport on Django 5.2, and a clear ImportError on 5.2 without the backport."""

import os
import subprocess
import sys

import django
import pytest

from axa_django import Job
from axa_django.backends import QueueBackend, framework
from tests.conftest import ROOT
from tests.testapp import jobs


def test_the_backend_serves_django_tasks_from_6_0_and_the_backport_before():
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == framework.FRAMEWORK
    assert issubclass(QueueBackend, framework.BaseTaskBackend)
    assert framework.BaseTaskBackend.__module__.startswith(expected)


def test_without_a_tasks_framework_importing_the_backend_says_what_to_install():
    # As on Django 5.2 without django-tasks; on 6.x django.tasks cannot be missing, so the
    # message is only reachable there by hiding the backport, which the backend then ignores.
    code = (
        "import sys; sys.modules['django_tasks'] = None\n"
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'axa_django.conf'\n"
        "from django.conf import settings; settings.configure(INSTALLED_APPS=['axa_django'])\n"
        "django.setup()\n"
        "from axa_django.selection import task_backend_aliases; print('aliases', task_backend_aliases())\n"
        "import axa_django.backends\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    if django.VERSION >= (6, 0):
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    assert "ImportError: axa_django.backends needs django.tasks (Django >= 6.0) or, on Django 5.2" in done.stderr
    assert "pip install 'axa-django[tasks]'" in done.stderr, done.stderr
    assert "aliases []" in done.stdout  # the worker without a framework claims no task rows, and starts


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="the backport's version matters on Django 5.2 only")
@pytest.mark.django_db(transaction=True)
def test_an_older_backport_is_named_and_a_project_without_tasks_still_runs_its_jobs(workers, tmp_path):
    # django-tasks 0.9-0.11 (which Wagtail 8 accepts) import, under older names: its
    # version is what the installed metadata says (a dist-info ahead on the path).
    info = tmp_path / "django_tasks-0.11.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: django-tasks\nVersion: 0.11.0\n")
    env = workers.env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    checked = subprocess.run(
        [sys.executable, "-m", "django", "check"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert checked.returncode != 0, checked.stdout
    assert "needs django-tasks >= 0.12 on Django 5.2" in checked.stderr and "0.11.0 is installed" in checked.stderr
    # A project whose TASKS names no QueueBackend: its worker starts and runs background jobs.
    job = jobs.add.perform_later(2, 3)
    proc = workers.start("--burst", env={**env, "AXA_TEST_NO_TASKS": "1"})
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert Job.objects.get(pk=job.pk).status == "completed"
