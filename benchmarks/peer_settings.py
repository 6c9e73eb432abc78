"""Settings for the django-tasks-db peer: the database DATABASE_URL names, persistent connections."""

import os
from pathlib import Path

from axa_django.devdb import database

DATABASES = {"default": database(Path(__file__).parent / ".data" / "pg", cleanup="stop")}
_max_age = os.environ.get("BENCH_PEER_CONN_MAX_AGE", "none")
DATABASES["default"]["CONN_MAX_AGE"] = None if _max_age.lower() == "none" else int(_max_age)
SECRET_KEY = "benchmarks"
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
