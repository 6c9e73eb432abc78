"""Settings for the benchmarks: DATABASE_URL, or an embedded PostgreSQL under benchmarks/.data."""

from pathlib import Path

from axa_django.devdb import database

DATABASES = {"default": database(Path(__file__).parent / ".data" / "pg", cleanup="stop")}
DATABASES["default"]["CONN_MAX_AGE"] = None
SECRET_KEY = "benchmarks"
USE_TZ = True
INSTALLED_APPS = ["axa_django", "benchmarks.benchapp"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AXA_DJANGO = {"POLL_INTERVAL": 1.0}
