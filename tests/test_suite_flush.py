"""The suite's flush between transactional tests (tests/testapp/management/commands/flush.py)
leaves what Django's TRUNCATE leaves: every table empty, the per-key counts with them."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from axa_django import Job
from tests.conftest import AXA_APPS
from tests.testapp import flow_jobs
from tests.testapp.management.commands import flush

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

TABLES = ("axa_queue", "axa_history", "axa_worker", "axa_flow_key", "axa_flow_delta", "axa_workflow", "axa_dependency")


def counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(f"(SELECT count(*) FROM {table})" for table in TABLES))
        return dict(zip(TABLES, cursor.fetchone(), strict=True))


def filenode() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_filenode('axa_queue')")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("rows", [3, flush.SMALL + 1], ids=["by DELETE", "by TRUNCATE"])
def test_the_suites_flush_empties_the_queue_its_history_and_the_per_key_counts(rows):
    flow_jobs.three_per_account.perform_later_many([{"account_id": n % 7} for n in range(rows)])
    job = Job.objects.first()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE axa_queue SET status = 'completed', finished_at = now() WHERE id = %s", [job.pk])
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at) "
            "VALUES (gen_random_uuid(), 'h', 1, 1, '[]', '[]', '[]', now(), now())"
        )
    before = counts()
    file_before = filenode()
    assert before["axa_queue"] == rows and before["axa_history"] == 1 and before["axa_flow_delta"] > 0, before
    call_command("flush", interactive=False, reset_sequences=False, allow_cascade=True, inhibit_post_migrate=True)
    assert counts() == dict.fromkeys(TABLES, 0)
    # TRUNCATE gives the table a new file; DELETE keeps it: the path the size asked for was taken.
    assert (filenode() == file_before) == (rows <= flush.SMALL)
