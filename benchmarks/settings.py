"""Settings for the benchmarks: DATABASE_URL, or an embedded PostgreSQL under benchmarks/.data."""

import os
from pathlib import Path

from axa_django.devdb import database

DATABASES = {"default": database(Path(__file__).parent / ".data" / "pg", cleanup="stop")}
DATABASES["default"]["CONN_MAX_AGE"] = None
SECRET_KEY = "benchmarks"
USE_TZ = True
INSTALLED_APPS = ["axa_django", "benchmarks.benchapp"]
if os.environ.get("BENCH_FLOW") == "1":
    INSTALLED_APPS.append("benchmarks.flowapp")  # benchmarks/flow.py: jobs with concurrency limits
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AXA_DJANGO = {"POLL_INTERVAL": 1.0}
if os.environ.get("AXA_BENCH_RETENTION"):  # benchmarks/soak.py --retention
    AXA_DJANGO["RETENTION"] = float(os.environ["AXA_BENCH_RETENTION"])
if os.environ.get("AXA_BENCH_TRANSACTION_POOLING") == "1":  # benchmarks/spread.py --pooler
    AXA_DJANGO["TRANSACTION_POOLING"] = True
