"""Settings for the django-tasks-db peer: its own database, axa_bench_peer, on the benchmark's server.

Connection settings are Django's defaults (CONN_MAX_AGE=0) unless BENCH_PEER_CONN_MAX_AGE says
otherwise ("none" for persistent connections, or a number of seconds).
"""

import os
from pathlib import Path

from axa_django.devdb import database

DATABASES = {"default": database(Path(__file__).parent / ".data" / "pg", cleanup="stop")}
DATABASES["default"]["NAME"] = "axa_bench_peer"
_max_age = os.environ.get("BENCH_PEER_CONN_MAX_AGE", "")
if _max_age:
    DATABASES["default"]["CONN_MAX_AGE"] = None if _max_age.lower() == "none" else int(_max_age)
SECRET_KEY = "benchmarks"
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
