"""Which tasks framework QueueBackend serves: django.tasks on Django >= 6.0, the django-tasks
backport on Django 5.2, and a clear ImportError on 5.2 without the backport."""

import subprocess
import sys

import django

from axa_django.backends import QueueBackend, framework
from tests.conftest import ROOT


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
