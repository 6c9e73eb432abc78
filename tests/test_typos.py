"""Typos that used to idle silently: a misspelt --queue, and a burst that leaves jobs it could not run (issue 25)."""

from __future__ import annotations

import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from axa_django import queues, selection
from axa_django.selection import UnknownQueues, check_known_queues
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, explain_reads
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def insert(name: str, count: int = 1, *, queue: str = "default") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, run_at) "
            "SELECT gen_random_uuid(), %s, '{}', %s, now() FROM generate_series(1, %s)",
            [name, queue, count],
        )


# -- a --queue nothing knows exits 2 --------------------------------------------------


def test_runworker_refuses_a_misspelt_queue_with_the_closest_known_ones(workers):
    for args in (["--queue", "emials"], ["--queue", "default:2", "--queue", "emials:2"]):
        result = workers.manage("runworker", "--burst", *args)
        assert result.returncode == 2, result.stdout + result.stderr
        error = result.stderr
        assert (
            "unknown queue 'emials': no registered job declares it, no queued job is in it, "
            "and no QueueBackend in settings.TASKS lists it." in error
        )
        assert "For 'emials', did you mean 'emails'?" in error
        assert "Known queues (python manage.py queues): default, emails," in error
        assert "give it with --new-queue instead of --queue" in error
        assert "starting" not in result.stdout + error


def test_runworker_takes_queues_known_from_rows_pauses_and_limits_and_new_ones(workers):
    insert("NoSuchJob", queue="from-a-row")
    queues.pause("paused-only")
    queues.limit("limited-only", 3)
    proc = workers.start(
        "--burst",
        "--queue",
        "from-a-row",
        "--queue",
        "paused-only",
        "--queue",
        "limited-only",
        "--new-queue",
        "brand-new",
        env=workers.env(AXA_LOG_LEVEL="INFO"),
    )
    assert proc.wait(timeout=60) == 0
    output = proc.stdout.read()
    assert "queues brand-new, from-a-row, limited-only, paused-only, database" in output, output


def test_the_check_needs_no_query_when_the_code_knows_the_queue(django_assert_num_queries):
    with django_assert_num_queries(0):
        check_known_queues(["emails", "default"], new=["n"], declared=["from-settings"])
        check_known_queues(["from-settings", "n"], new=["n"], declared=["from-settings"])
    with django_assert_num_queries(1), pytest.raises(UnknownQueues, match="unknown queues 'a', 'b': no registered job"):
        check_known_queues(["b", "a", "emails"])


def test_the_table_queues_are_read_by_a_loose_index_scan_of_the_queue_alone():
    # Forty closed history tables, as a year of weekly closes leaves: each descent read
    # every one's (empty) index of queued rows too, 79 pages a queue.
    tables = [f"axa_history_typos{i}" for i in range(40)]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, run_at) "
            "SELECT gen_random_uuid(), 'n' || (i % 5), '{}', 'q' || (i % 4), now() FROM generate_series(1, 40000) AS i"
        )
        for table in tables:
            cursor.execute("SELECT axa_history_make(%s, nextval('axa_history_number'))", [table])
    try:
        scans, pages, table_pages, plan = explain_reads(selection.TABLE_QUEUES, {"most": 1000})
        assert ("Seq Scan", "axa_queue") not in scans and ("Bitmap Heap Scan", "axa_queue") not in scans, plan
        assert pages < table_pages / 10, f"{pages} of {table_pages} pages read:\n{plan}"
        assert selection.table_queues() == {"q0", "q1", "q2", "q3"}
    finally:
        with connection.cursor() as cursor:
            for table in tables:
                cursor.execute(f"DROP TABLE {table}")


# -- a burst names the ready jobs it leaves -------------------------------------------


def test_runworker_burst_names_the_ready_jobs_it_could_not_run_and_exits_0(workers):
    insert("NoSuchJob", 2)
    jobs.add.using(queue="emails").perform_later(1)
    queues.pause("emails", "maintenance")
    result = workers.manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    # tests.settings shows axa_django at WARNING: the line is there because it is a warning.
    line = next(line for line in result.stderr.splitlines() if " stopped after " in line)
    assert line.endswith(
        "stopped after 0 attempts; ready jobs it could not run: 2 of job 'NoSuchJob' in queue 'default' "
        "(no job of that name is registered here: renamed, or its module not imported by an app's jobs.py?); "
        "1 in queue 'emails', which is paused (python manage.py queues resume emails)"
    ), line


def test_a_burst_worker_says_nothing_of_queues_and_names_it_was_not_asked_to_run(caplog):
    # Issue 45: other queues (--queue) and other names (--job) are not its to run; the
    # fleet's running workers warn about those no live worker claims.
    caplog.set_level(logging.INFO, logger="axa_django")
    insert("tests.testapp.jobs.add", 2, queue="emails")
    insert("CountWorker", 1)
    assert Worker(queues=["default"], names=["tests.testapp.jobs.add"], burst=True, install_signals=False).run() == 0
    [record] = [r for r in caplog.records if " stopped after " in r.getMessage()]
    assert record.levelno == logging.INFO and record.getMessage().endswith("stopped after 0 attempts"), record


def test_a_burst_that_leaves_nothing_says_so_at_info(caplog):
    caplog.set_level(logging.INFO, logger="axa_django")
    jobs.add.perform_later(1)
    assert Worker(burst=True, install_signals=False).run() == 0
    [record] = [r for r in caplog.records if " stopped after " in r.getMessage()]
    assert record.levelno == logging.INFO and record.getMessage().endswith("stopped after 1 attempt: 1 completed")


def test_a_queue_listed_in_known_queues_is_known_to_runworker_without_reading_the_table():
    with override_settings(AXA_DJANGO={"KNOWN_QUEUES": ["bulk-eu"]}), CaptureQueriesContext(connection) as queries:
        check_known_queues(["bulk-eu"])
    assert len(queries) == 0
    with pytest.raises(UnknownQueues, match="unknown queue 'bulk-eu'"):
        check_known_queues(["bulk-eu"])
