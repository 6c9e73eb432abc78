"""benchmarks/run.py runs end to end for axa alone, at tiny sizes (its figures are never asserted)."""

import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT, database_url


@pytest.mark.django_db(transaction=True)
def test_the_benchmark_runs_and_counts_every_job_once(tmp_path):
    prefix = f"{connection.settings_dict['NAME']}_bench_"
    env = dict(os.environ, DATABASE_URL=database_url())
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = tmp_path / "bench.json"
    command = [sys.executable, "benchmarks/run.py", "--drain", "50", "--latency-jobs", "10", "--skip", "single"]
    command += ["--latency-gap", "0.01", "--skip", "bulk", "--skip", "drain2", "--skip", "claim"]
    command += ["--idle-timeout", "0", "--db-prefix", prefix, "--json", str(out)]
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{prefix}axa" WITH (FORCE)')
    assert result.returncode == 0, result.stdout + result.stderr
    header = result.stdout.splitlines()[1]
    assert "fsync=" in header and "synchronous_commit=" in header, header
    assert "TCP " in header or "Unix socket" in header, header
    runs = json.loads(out.read_text())["runs"]["axa"]
    assert set(runs) == {"drain1", "latency"}
    for phase in ("drain1", "latency"):
        assert runs[phase][0]["duplicates"] == 0 and runs[phase][0]["missing"] == 0, runs[phase]
    assert runs["drain1"][0]["per_s"] > 0 and runs["latency"][0]["p99_ms"] > 0
    assert "duplicates 0, missing 0" in result.stdout
