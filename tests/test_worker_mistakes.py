"""Worker mistakes are loud: unknown --job names, bad --queue values, refused logins, unclaimed jobs, logging."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import threading
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection

from axa_django import sql, unhandled
from axa_django.selection import UnknownJobs
from axa_django.unhandled import Unhandled
from axa_django.worker import Worker, logs
from tests.conftest import AXA_APPS, Workers, database_url, explain_reads, wait_for
from tests.testapp import jobs, workermistakes_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def insert(name: str, count: int = 1, *, queue: str = "default", backend: str | None = None, later: bool = False):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, backend, run_at) "
            "SELECT gen_random_uuid(), %s, '{}', %s, %s, now() + %s * interval '1 hour' FROM generate_series(1, %s)",
            [name, queue, backend, 1 if later else 0, count],
        )


def live_worker(names: list[str], *, queues: list[str] | None = None, backends: list[str] | None = None, age=0):
    """A registered worker row, as a worker process writes it; ``age`` seconds since its heartbeat."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, started_at, heartbeat_at)"
            " VALUES (%s, 'elsewhere', 1, 1, %s, %s, %s, now(), now() - %s * interval '1 second')",
            [uuid.uuid4(), json.dumps(queues or []), json.dumps(names), json.dumps(backends or []), age],
        )


def output_of(proc: Any) -> list[str]:
    """Collect a worker subprocess's output lines on a thread, so a test can wait on them."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return lines


def with_database(workers: Workers, name: str, **url: str) -> dict[str, str]:
    env = workers.env()
    current = connection.settings_dict["NAME"]
    env["DATABASE_URL"] = database_url().replace(f"/{current}", f"/{name}")
    for old, new in url.items():
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(old, new)
    return env


# -- 1. --job and --queue ---------------------------------------------------------


def test_runworker_refuses_unknown_job_names_and_lists_the_known_ones(workers):
    result = workers.manage("runworker", "--burst", "--job", "add", "--job", "CountWorkr", "--job", "CountWorker")
    assert result.returncode == 2, result.stdout + result.stderr
    error = result.stderr
    assert "no job is registered as 'CountWorkr', 'add'." in error
    assert "For 'add', did you mean 'tests.testapp.jobs.add'?" in error
    assert "For 'CountWorkr', did you mean 'CountWorker'?" in error
    assert "Known jobs (python manage.py listjobs):\n" in error and "\n  CountWorker\n" in error
    # The first LISTED names, then how many more: a name late in the order may be in the count.
    assert "  tests.testapp.workermistakes_jobs.chatty\n" in error or re.search(r"\n  \.\.\. and \d+ more\n", error)
    assert "starting" not in result.stdout + error


def test_a_worker_refuses_unknown_names_in_process_too():
    with pytest.raises(UnknownJobs, match="no job is registered as 'nope'"):
        Worker(names=["nope", "CountWorker"], install_signals=False)


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("", "a queue name cannot be empty or blank, got ''"),
        ("  ", "a queue name cannot be empty or blank, got '  '"),
        ("emails\n", "a queue name cannot contain control characters, got 'emails\\n'"),
        ("em\x1bails", "a queue name cannot contain control characters, got 'em\\x1bails'"),
        (" emails", "a queue name cannot start or end with whitespace, got ' emails'"),
    ],
)
def test_runworker_refuses_queue_names_no_job_can_have(workers, queue, message):
    result = workers.manage("runworker", "--burst", "--queue", "default", "--queue", queue)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"argument --queue: {message}" in result.stderr


# -- 2. ready jobs no live worker claims ------------------------------------------


def test_unhandled_lists_ready_jobs_that_no_live_worker_claims():
    insert("NoSuchJob", 3)
    insert("NoSuchJob", queue="later", later=True)  # not ready yet
    insert("CountWorker", 2)  # claimed by the live worker below
    insert("CountWorker", queue="emails")  # ... which does not run this queue
    insert("tests.testapp.jobs.add")  # only a dead worker claimed it
    insert("some.module.task", 2, backend="ghost")  # a django.tasks backend nobody runs
    insert("some.module.task", backend="default")  # a backend the live worker runs
    live_worker(["CountWorker"], queues=["default"], backends=["default"])
    live_worker(["tests.testapp.jobs.add"], age=3600)
    assert unhandled.find() == [
        Unhandled("NoSuchJob", None, "default", 3),
        Unhandled(None, "ghost", "default", 2),
        Unhandled("CountWorker", None, "emails", 1),
        Unhandled("tests.testapp.jobs.add", None, "default", 1),
    ]


def test_unhandled_counts_stop_at_the_cap(monkeypatch):
    monkeypatch.setattr(unhandled, "CAP", 5)
    insert("NoSuchJob", 8)
    [entry] = unhandled.find()
    assert entry.ready == 5


def test_unhandled_warnings_are_said_once_per_name_and_queue(caplog):
    unhandled.reset()
    caplog.set_level(logging.WARNING, logger="axa_django")
    a, b = Unhandled("NoSuchJob", None, "default", 3), Unhandled("NoSuchJob", None, "emails", unhandled.CAP)
    assert unhandled.warn([a]) == [a]
    assert unhandled.warn([a, b]) == [b]
    assert unhandled.warn([a, b]) == []
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith("job 'NoSuchJob' in queue 'default': 3 ready and no live worker claims them (is the")
    assert f"job 'NoSuchJob' in queue 'emails': at least {unhandled.CAP} ready" in messages[1]
    assert len(messages) == 2


def test_a_running_worker_warns_about_ready_jobs_no_live_worker_claims(caplog):
    unhandled.reset()
    caplog.set_level(logging.WARNING, logger="axa_django")
    insert("NoSuchJob", 2)
    jobs.count.perform_later(fail=False)
    worker = Worker(concurrency=1, install_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        record = wait_for(
            lambda: next((r for r in caplog.records if "NoSuchJob" in r.getMessage()), None),
            what="the worker's warning about NoSuchJob",
        )
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("job 'NoSuchJob' in queue 'default': 2 ready and no live worker claims them")
    assert not [r for r in caplog.records if "CountWorker" in r.getMessage()]


def test_the_unhandled_query_walks_the_claim_indexes_not_the_table():
    # 100,000 rows of handled names, future rows of an unhandled one: the statement
    # reads pages in proportion to the distinct names and the ready rows it counts.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, run_at, priority) "
            "SELECT gen_random_uuid(), 'handled' || (i % 7), '{}', 'q' || (i % 3), now() - interval '1 minute', i % 2"
            " FROM generate_series(1, 100000) AS i"
        )
    insert("NoSuchJob", 2000, later=True)
    insert("NoSuchJob", 5)
    # Live through explain_reads' VACUUM, which can outlast a lease on a busy machine: a
    # worker seen as dead left every pair unhandled, and each was counted (CI, PostgreSQL 15).
    live_worker([f"handled{i}" for i in range(7)], age=-600)
    scans, pages, table_pages, plan = explain_reads(sql.UNHANDLED, unhandled.params())
    # No scan of the table; a bitmap over the ready rows of one name is a plan PostgreSQL 15
    # picks on some samples of the statistics (housekeeping plans with bitmap scans on), and
    # reads only those rows: the pages read say whether the table was walked.
    assert ("Seq Scan", "axa_queue") not in scans, plan
    assert pages < table_pages / 5, f"{pages} of {table_pages} pages read:\n{plan}"
    assert unhandled.find() == [Unhandled("NoSuchJob", None, "default", 5)]


# -- 3. a database that refuses the worker ----------------------------------------


def test_runworker_fails_at_once_when_the_database_does_not_exist(workers):
    missing = f"axa_missing_{uuid.uuid4().hex[:8]}"
    proc = workers.start("--burst", env=with_database(workers, missing))
    assert proc.wait(timeout=30) == 2
    output = proc.stdout.read()
    assert f"CommandError: cannot connect to database '{missing}'" in output
    assert f'database "{missing}" does not exist' in output
    assert "retr" not in output  # no retrying


def test_runworker_fails_at_once_on_a_wrong_password(workers):
    s = connection.settings_dict
    params = {"dbname": s["NAME"], "user": s["USER"], "host": s["HOST"], "port": s["PORT"] or None}
    try:
        psycopg.connect(**params, password="certainly-wrong", connect_timeout=10).close()
        pytest.skip(
            "this server lets any password in (the embedded server trusts local logins); run with a DATABASE_URL"
        )
    except psycopg.OperationalError:
        pass
    user = s["USER"]
    env = with_database(workers, s["NAME"])
    auth = f"{user}:{s['PASSWORD']}@" if s["PASSWORD"] else f"{user}@"
    env["DATABASE_URL"] = env["DATABASE_URL"].replace(auth, f"{user}:certainly-wrong@", 1)
    proc = workers.start("--burst", env=env)
    assert proc.wait(timeout=30) == 2
    output = proc.stdout.read()
    assert "CommandError: cannot connect to database" in output and "authentication failed" in output, output


def test_runworker_waits_for_a_database_that_is_not_up_yet_and_says_so(workers):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = closed.getsockname()[1]
        env = workers.env(DATABASE_URL=f"postgresql://axa@127.0.0.1:{port}/axa")
        proc = workers.start("--burst", env=env)
        lines = output_of(proc)
        wait_for(lambda: len([line for line in lines if "yet" in line]) >= 2, what="two retries, said")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    said = next(line for line in lines if "yet" in line)
    assert f"cannot reach database 'axa' on 127.0.0.1:{port} yet (" in said and "Connection refused" in said
    assert "the worker has not started and retries in" in said


# -- 4. logging ---------------------------------------------------------------------


def project_logging(workers: Workers, kind: str) -> dict[str, str]:
    return workers.env(DJANGO_SETTINGS_MODULE="tests.workermistakes_settings", AXA_TEST_LOGGING=kind)


def test_runworker_leaves_a_projects_loggers_alone_and_logs_each_attempt_at_v2(workers):
    job = workermistakes_jobs.chatty.perform_later(token="t1")
    proc = workers.start("--burst", "-v", "2", env=project_logging(workers, "project"))
    assert proc.wait(timeout=60) == 0
    output = proc.stdout.read()
    assert output.count("hello from the job t1") == 1, output
    assert output.count(" starting: concurrency 4, ") == 1, output
    line = f"INFO axa_django.jobs: job tests.testapp.workermistakes_jobs.chatty {job.pk} attempt 1: completed in "
    assert output.count(line) == 1, output
    assert "stopped after 1 attempt: 1 completed" in output


def test_runworker_under_a_root_handler_prints_each_line_once(workers):
    job = workermistakes_jobs.chatty.perform_later(token="t2")
    proc = workers.start("--burst", "-v", "2", env=project_logging(workers, "root"))
    assert proc.wait(timeout=60) == 0
    output = proc.stdout.read()
    assert output.count("hello from the job t2") == 1, output
    assert output.count(" starting: concurrency 4, ") == 1, output
    assert output.count(f"job tests.testapp.workermistakes_jobs.chatty {job.pk} attempt 1: completed in ") == 1


def test_the_attempt_line_says_the_outcome_then_when_the_next_attempt_runs(caplog):
    caplog.set_level(logging.INFO, logger="axa_django.jobs")
    logs.attempt_line("shop.jobs.send", "j1", 1, 3, 0.0012, "queued", 2.5)
    logs.attempt_line("shop.jobs.send", "j1", 2, 3, 0.0041, "completed", 0.0)
    logs.attempt_line("shop.jobs.send", "j2", 1, None, 0.5, "failed", 0.0)
    assert caplog.messages == [
        "job shop.jobs.send j1 attempt 1/3: failed in 0.001s, next attempt in 2.5s",
        "job shop.jobs.send j1 attempt 2/3: completed in 0.004s",
        "job shop.jobs.send j2 attempt 1: failed in 0.500s",
    ]


def test_the_worker_counts_attempts_and_says_handler_in_the_singular(caplog, log_file):
    caplog.set_level(logging.INFO, logger="axa_django")
    jobs.add.perform_later(1)
    jobs.count.perform_later(fail=True)
    flaky = jobs.flaky.perform_later(log=log_file)  # fails twice, then completes
    worker = Worker(concurrency=1, burst=True, install_signals=False, log_attempts=True)
    assert worker.run() == 0
    text = caplog.text
    # What happened, in the order it happened: no "to be retried", no "retry in 0s in 0.001s".
    assert "stopped after 5 attempts: 2 completed, 1 failed, 2 queued again after an error" in text
    assert re.search(
        rf"job tests\.testapp\.jobs\.flaky {flaky.pk} attempt 1/3: failed in \d+\.\d{{3}}s, next attempt at once$",
        text,
        re.M,
    ), text
    assert f"job tests.testapp.jobs.flaky {flaky.pk} attempt 3/3: completed in " in text
    caplog.clear()
    assert Worker(names=["CountWorker"], burst=True, install_signals=False).run() == 0
    assert ", 1 handler (CountWorker), " in caplog.text
    assert "stopped after 0 attempts" in caplog.text
