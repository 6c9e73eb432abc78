"""Settings for the test suite: DATABASE_URL, or an embedded PostgreSQL per test session."""

import json
import os
import tempfile
from pathlib import Path

import django

from axa_django.devdb import database
from tests.cleanup import exit_cleanly_on_sigterm, remove_at_exit

# Which test process started the server DATABASE_URL names (inherited by subprocesses).
# pytest-xdist workers inherit the controller's: each starts one of its own, so that a
# test restarting its server never cuts another worker's connections. Runworker
# subprocesses carry their worker's name and reuse its server.
_ME = os.environ.get("PYTEST_XDIST_WORKER", "main") + ":" + os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
_OWNER = os.environ.get("AXA_TEST_SERVER_OF")
if not os.environ.get("DATABASE_URL") or (_OWNER is not None and _OWNER != _ME):
    # Each test session gets its own server in a fresh directory, removed at exit.
    os.environ.pop("DATABASE_URL", None)
    os.environ["AXA_TEST_SERVER_OF"] = _ME
    _ROOT = Path(tempfile.mkdtemp(prefix="axa-test-"))
    remove_at_exit(_ROOT)
    exit_cleanly_on_sigterm()  # from here on a SIGTERM must still stop the server
    _DATA = _ROOT / "pg"
    DATABASES = {"default": database(_DATA, cleanup="delete")}
    TEST_PGDATA = str(_DATA)  # lets the outage test restart the server
else:
    DATABASES = {"default": database("unused")}
if os.environ.get("AXA_TEST_PREPARE") == "none":
    # A worker subprocess with psycopg's server-side prepared statements off.
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("AXA_TEST_DB_NAME", "axa_test")}
# A database that is not PostgreSQL, for the checks that must refuse one; nothing migrates there.
DATABASES["sqlite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
DATABASE_ROUTERS = ["tests.routers.PostgresOnly"]

SECRET_KEY = "tests"
# Test users' passwords need no strength: the default hasher costs half a second a user.
# The default stays second, to check passwords the example project set (test_example).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", "django.contrib.auth.hashers.PBKDF2PasswordHasher"]
DEBUG = False
USE_TZ = os.environ.get("AXA_TEST_USE_TZ", "1") == "1"
TIME_ZONE = os.environ.get("AXA_TEST_TIME_ZONE", "UTC")
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the live server serves the admin's CSS to the browser test
    "axa_django",
    "tests.testapp",
    "tests.refapp",  # a user's models pointing at jobs (tests/test_references.py)
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
AXA_DJANGO = {
    "POLL_INTERVAL": float(os.environ.get("AXA_TEST_POLL", "0.2")),
    "LEASE_SECONDS": float(os.environ.get("AXA_TEST_LEASE", "3")),
    "NOTIFY": os.environ.get("AXA_TEST_NOTIFY", "1") == "1",
}
if os.environ.get("AXA_TEST_RETENTION"):
    AXA_DJANGO["RETENTION"] = float(os.environ["AXA_TEST_RETENTION"])
if os.environ.get("AXA_TEST_POOLING") == "1":
    # A worker subprocess that reaches the database through a transaction pooler.
    AXA_DJANGO["TRANSACTION_POOLING"] = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"axa_django": {"handlers": ["console"], "level": os.environ.get("AXA_LOG_LEVEL", "WARNING")}},
}

# Django >= 6.0 has django.tasks; on Django 5.2 the django-tasks backport (django_tasks,
# in the dev extra) takes its place, as for a library written for 5.2: the tasks tests
# run on both (tests/tasks_api.py imports whichever the project has).
TASKS_FRAMEWORK = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
if TASKS_FRAMEWORK == "django_tasks":
    INSTALLED_APPS.append("django_tasks")  # as the backport asks: its system checks
TASKS = {
    "default": {"BACKEND": "axa_django.backends.QueueBackend", "QUEUES": ["default", "emails"]},
    "retrying": {
        "BACKEND": "axa_django.backends.QueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF": 0},
    },
    # Not ours: a worker must refuse rows naming its tasks.
    "dummy": {"BACKEND": f"{TASKS_FRAMEWORK}.backends.dummy.DummyBackend"},
}
if os.environ.get("AXA_TEST_TASK_OPTIONS"):  # a subprocess given the default alias's OPTIONS
    TASKS["default"]["OPTIONS"] = json.loads(os.environ["AXA_TEST_TASK_OPTIONS"])
if os.environ.get("AXA_TEST_NO_TASKS"):  # a project that uses no tasks at all
    del TASKS
