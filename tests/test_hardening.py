"""No job, no row and no thread's death may stop a worker or lose work (issue: hardening)."""

import datetime
import json
import os
import signal
import socket
from pathlib import Path

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from axa_django import Job, conf, enqueue, sql
from axa_django.exceptions import BadRow
from axa_django.execution import decode_args
from axa_django.worker import Worker, connect, keepalives
from tests.conftest import wait_for
from tests.testapp import hostile_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True)


def lease() -> float:
    return float(conf.get("LEASE_SECONDS"))


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def burst(workers, *args: str, timeout: float = 60) -> tuple[int, str]:
    proc = workers.start("--burst", *args)
    code = proc.wait(timeout=timeout)
    return code, proc.stdout.read()


def insert_row(name: str, args_json: str, **columns: str) -> str:
    """A row written by SQL, with values the ORM would never write."""
    names = ", ".join(["id", "name", "args", *columns])
    values = ", ".join(["gen_random_uuid()", "%s", "%s::jsonb", *(f"{v}" for v in columns.values())])
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO axa_queue ({names}) VALUES ({values}) RETURNING id", [name, args_json])
        return cursor.fetchone()[0]


# -- 1.1 any BaseException from a job ----------------------------------------------


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "GeneratorExit", "SystemExit", "Custom"])
@pytest.mark.parametrize(
    "job_function", [hostile_jobs.raise_base, hostile_jobs.async_raise_base], ids=["sync", "async"]
)
def test_a_base_exception_from_a_job_fails_the_attempt_and_the_worker_goes_on(workers, log_file, kind, job_function):
    if kind == "GeneratorExit" and job_function is hostile_jobs.async_raise_base:
        pytest.skip("a coroutine cannot raise GeneratorExit to its awaiter")
    bad = job_function.perform_later(kind, log=log_file)
    after = jobs.add.perform_later(1, 2)
    code, output = burst(workers, "--concurrency", "1")
    assert code == 0, output
    row = fresh(bad)
    assert row.status == "failed" and row.attempts == 2, (row.status, row.attempts, output)
    module = "tests.testapp.hostile_jobs" if kind == "Custom" else "builtins"
    assert [entry["type"] for entry in row.errors] == [f"{module}.{kind}"] * 2
    assert "raised by the" in row.errors[0]["message"] and "Traceback" in row.error
    assert lines(log_file) == [kind, kind]
    assert fresh(after).status == "completed" and fresh(after).result == 3


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "Custom"])
def test_a_base_exception_from_a_task_fails_it_and_the_worker_goes_on(workers, kind):
    result = hostile_jobs.task_raise_base.enqueue(kind)
    after = jobs.add.perform_later(1, 2)
    code, output = burst(workers, "--concurrency", "1")
    assert code == 0, output
    row = Job.objects.get(pk=result.id)
    module = "tests.testapp.hostile_jobs" if kind == "Custom" else "builtins"
    assert row.status == "failed" and row.errors[-1]["type"] == f"{module}.{kind}", (row.status, row.errors)
    assert hostile_jobs.task_raise_base.get_result(result.id).status == "FAILED"
    assert fresh(after).status == "completed"


# -- 1.2 rows the worker cannot decode -------------------------------------------------


def test_rows_the_worker_cannot_decode_fail_alone_and_the_worker_keeps_draining(workers):
    deep = insert_row("tests.testapp.jobs.add", '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}")
    huge = insert_row("tests.testapp.jobs.add", '{"a": ' + "7" * 5_000 + "}")
    never = insert_row("tests.testapp.jobs.add", '{"a": 1}', run_at="'infinity'")
    worn = insert_row("tests.testapp.jobs.add", '{"a": 1}', attempts="2147483647", max_attempts="2147483647")
    good = jobs.add.perform_later(2, 3)
    code, output = burst(workers, "--concurrency", "2")
    assert code == 0, output
    rows = {row.pk: row for row in Job.objects.defer("args")}  # Python cannot load some of these args
    assert rows[deep].status == "failed" and "nested too deeply" in rows[deep].error
    assert rows[huge].status == "failed" and "cannot be decoded" in rows[huge].error
    assert "digits" in rows[huge].error
    assert rows[never].status == "failed" and "infinity" in rows[never].error
    assert rows[never].run_at is not None  # finite again: every reader can load the row
    assert rows[worn].status == "completed" and rows[worn].attempts == 2147483647
    assert rows[good.pk].status == "completed" and rows[good.pk].result == 5


@pytest.mark.django_db(transaction=False)
def test_args_text_decodes_as_json_loads_reads_it_or_fails_as_a_bad_row():
    for text in ['{"a": [1, {"b": null}]}', ' \n{"a": 1}\t ', '{"s": "\\u00e9 \\" x"}', "[]", "7"]:
        assert decode_args(text) == json.loads(text), text
    for text, said in [
        ('{"a": 1} {"b": 2}', "Extra data"),
        ('{"a": 1', "Expecting"),
        ("", "Expecting value"),
        ('{"a": ' + "7" * 5_000 + "}", "digits"),
        ('{"a": ' + "[" * 10_000 + "]" * 10_000 + "}", "nested too deeply"),
    ]:
        with pytest.raises(BadRow, match=said):
            decode_args(text)


# Before year 1 (in UTC: "0001-01-01 00:30+01" is 1 BC there), which Python cannot load.
BEFORE_YEAR_ONE = ["'0044-03-15 BC'", "'4713-01-01 00:00:00+00 BC'", "'0001-01-01 00:30:00+01'"]


@pytest.mark.parametrize("run_at", BEFORE_YEAR_ONE)
def test_a_row_due_before_year_one_runs_and_the_rows_claimed_with_it_too(workers, run_at):
    # Loading such a run_at failed the whole claim after it had committed: every row
    # it took was left running under a worker that never ran them, and it went again
    # at each rescue. Plain, concurrency-limited and rate-limited claims alike.
    from tests.testapp import flow_jobs

    names = {
        "plain": "tests.testapp.jobs.add",
        "limited": "tests.testapp.flow_jobs.one_per_account",
        "rated": "tests.testapp.flow_jobs.five_per_second",
    }
    args = {"plain": '{"a": 1, "b": 2}', "limited": '{"account_id": 7}', "rated": '{"api": "x"}'}
    keys = {"plain": {}, "limited": {"concurrency_key": "'acct:7'"}, "rated": {"rate_key": "'x'"}}
    old = {kind: insert_row(names[kind], args[kind], run_at=run_at, **keys[kind]) for kind in names}
    others = [jobs.add.perform_later(i, 1) for i in range(5)] + [flow_jobs.one_per_account.perform_later(8)]
    code, output = burst(workers, "--concurrency", "2")
    assert code == 0, output
    assert "DataError" not in output, output
    for kind, pk in old.items():
        row = Job.objects.get(pk=pk)
        assert row.status == "completed", (kind, row.status, row.error, output)
        assert row.run_at.year >= 2000, (kind, row.run_at)  # the claim's time: every reader can load it
    assert [fresh(job).status for job in others] == ["completed"] * len(others), (
        [fresh(job).error for job in others],
        output,
    )


def test_an_idle_worker_lives_next_to_a_row_due_at_infinity(workers):
    insert_row("tests.testapp.jobs.add", '{"a": 1}', run_at="'infinity'")
    proc = workers.start("--concurrency", "1")
    wait_for(lambda: Job.objects.filter(status="failed").exists(), what="the never-due row failed")
    job = jobs.add.perform_later(1)
    wait_for(lambda: fresh(job).status == "completed", what="the next job")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


# -- 1.3 NUL and surrogates in an outcome ------------------------------------------


def test_nul_in_a_result_or_an_error_is_written_and_later_outcomes_keep_flowing(workers):
    result = hostile_jobs.return_nul.perform_later()
    error = hostile_jobs.raise_nul.perform_later()
    after = jobs.add.perform_later_many([{"a": i} for i in range(20)])
    code, output = burst(workers, "--concurrency", "4")
    assert code == 0, output
    row = fresh(result)
    assert row.status == "failed", (row.status, row.result)
    assert "NUL" in row.error or "\\u0000" in row.error, row.error
    row = fresh(error)
    assert row.status == "failed"
    assert "bad \\x00 byte" in row.error and "shown as \\x00" in row.error
    assert "\\ud800" in row.errors[0]["message"]
    assert Job.objects.filter(pk__in=[j.pk for j in after], status="completed").count() == 20


# -- 1.4 a dead internal thread ends the worker ------------------------------------


@pytest.mark.halved
@pytest.mark.parametrize("thread", ["axa-finisher", "axa-listener", "axa-heartbeat", "MainThread"])
def test_a_dead_worker_thread_ends_the_worker_with_exit_1(workers, thread):
    hostile_jobs.kill_thread.perform_later(thread)
    proc = workers.start("--concurrency", "1")
    code = proc.wait(timeout=60)
    output = proc.stdout.read()
    assert code == 1, output
    assert "ThreadKilled" in output and "stopping the worker" in output, output
    # Another worker takes over, and the killer job's row does not stay running forever.
    survivor = workers.start("--concurrency", "1", "--job", "tests.testapp.jobs.add")
    job = jobs.add.perform_later(4)
    wait_for(lambda: fresh(job).status == "completed", what="another worker draining")
    wait_for(
        lambda: not Job.objects.filter(status="running").exists(), timeout=3 * lease() + 10, what="no row left running"
    )
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0


# -- 1.5 a leaked transaction ----------------------------------------------------------


def markers() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM axa_schedule WHERE name LIKE 'marker-%%'")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.parametrize("how", ["begin", "atomic", "autocommit"])
def test_a_job_that_leaks_a_transaction_fails_and_the_next_job_runs_clean(workers, how):
    leaky = hostile_jobs.leak_transaction.perform_later(how, f"marker-leak-{how}")
    after = hostile_jobs.write_marker.perform_later(f"marker-after-{how}")
    proc = workers.start("--concurrency", "1")  # one thread: the next job gets the same connection
    wait_for(lambda: fresh(after).status in ("completed", "failed"), what="the job after the leak")
    row = fresh(leaky)
    assert row.status == "failed", row.status
    assert "transaction still open" in row.error and "rolled back" in row.error
    assert row.errors[0]["type"] == "axa_django.exceptions.LeakedTransaction"
    assert fresh(after).status == "completed"
    # While the worker still runs: the next job's write is committed, the leaked one rolled back.
    assert markers() == {f"marker-after-{how}"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert markers() == {f"marker-after-{how}"}


# -- 1.6 crash loops ----------------------------------------------------------------


@pytest.mark.halved
@pytest.mark.parametrize("max_losses", [None, 1], ids=["default", "override"])
def test_a_job_that_kills_its_worker_runs_max_losses_times_then_fails(workers, log_file, max_losses):
    # At the defaults: one attempt (MAX_ATTEMPTS) and three losses (MAX_LOSSES).
    job = hostile_jobs.kill_worker.using(max_losses=max_losses).perform_later(log_file)
    runs = max_losses or conf.get("MAX_LOSSES")
    assert runs == (1 if max_losses else 3)
    for _ in range(runs + 3):
        proc = workers.start("--concurrency", "1")
        wait_for(
            lambda p=proc: p.poll() is not None or fresh(job).status == "failed",
            timeout=3 * lease() + 30,
            what="the worker to die or the job to fail",
        )
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            break
        assert proc.returncode == 9
    row = fresh(job)
    assert row.status == "failed", (row.status, len(lines(log_file)))
    assert len(lines(log_file)) == runs
    assert (row.attempts, row.losses) == (1, runs)
    assert [entry["type"] for entry in row.errors] == ["WorkerLost"] * runs
    assert row.error.startswith(f"WorkerLost: the worker running this job stopped {runs} times (max_losses {runs})")
    # Another worker does not run it again.
    code, _ = burst(workers, "--concurrency", "1")
    assert code == 0 and len(lines(log_file)) == runs


# -- 1.7 the heartbeat waits on nothing else -------------------------------------------


@pytest.mark.halved
def test_housekeeping_that_takes_three_leases_does_not_get_running_jobs_rescued(workers, log_file):
    job = jobs.slow.perform_later(3 * lease() + 3, log=log_file, token="long")
    stalled = workers.start("--concurrency", "2", env=workers.env(AXA_TEST_SLOW_HOUSEKEEPING="1"))
    wait_for(lambda: lines(log_file), what="the long job to start")
    assert fresh(job).worker_id is not None
    rescuer = workers.start("--concurrency", "1", "--job", "tests.testapp.jobs.add")
    wait_for(lambda: Job.objects.filter(name="tests.slow_housekeeping").exists(), what="the stalling enqueue")
    wait_for(lambda: fresh(job).status != "running", timeout=6 * lease() + 20, what="the long job to end")
    row = fresh(job)
    assert row.status == "completed" and row.attempts == 1, (row.status, row.errors)
    assert row.errors == []
    assert [line.split()[0] for line in lines(log_file)] == ["start", "end"]
    for proc in (stalled, rescuer):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.halved
def test_a_long_graceful_shutdown_keeps_the_lease(workers, log_file):
    job = jobs.slow.perform_later(3 * lease(), log=log_file, token="long")
    proc = workers.start("--concurrency", "1")
    wait_for(lambda: lines(log_file), what="the long job to start")
    rescuer = workers.start("--concurrency", "1", "--job", "tests.testapp.jobs.add")
    proc.send_signal(signal.SIGTERM)  # finishing takes three leases; the heartbeat must go on meanwhile
    assert proc.wait(timeout=6 * lease() + 20) == 0
    row = fresh(job)
    assert row.status == "completed" and row.errors == [], (row.status, row.errors)
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=30) == 0


# -- 1.8 silent partitions: TCP keepalives ---------------------------------------------


def test_worker_connections_set_keepalives_and_a_tcp_user_timeout():
    expected = keepalives(lease())
    with connect("default", "test") as conn:
        parameters = conn.info.get_parameters()
        for key, value in expected.items():
            assert parameters.get(key) == str(value), (key, parameters)
        if not parameters.get("host", "/").startswith("/"):
            sock = socket.socket(fileno=os.dup(conn.fileno()))
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == expected["keepalives_idle"]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == expected["tcp_user_timeout"]
            finally:
                sock.detach()


def test_the_projects_options_win_over_the_workers_keepalives():
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    options["keepalives_idle"] = 77
    try:
        with connect("default", "test") as conn:
            assert conn.info.get_parameters()["keepalives_idle"] == "77"
    finally:
        del options["keepalives_idle"]


# -- 2. names that look like SQL or format strings -------------------------------------


def test_job_names_that_look_like_sql_or_format_strings_stay_data(workers):
    names = ["%(queues)s", "{names}", "';DROP/**/TABLE/**/axa_queue;--", "%s%%%(limit)s"]
    rows = [enqueue(name) for name in names]
    # A --queue worker writes queues into its statements too.
    code, output = burst(workers, "--concurrency", "2", "--queue", "default", "--new-queue", "%(names)s")
    assert code == 0, output
    assert {fresh(row).status for row in rows} == {"completed"}, output
    assert {fresh(row).result for row in rows} == {"ran"}


def test_compose_writes_each_value_once_whatever_it_holds():
    text = sql.compose(sql.NEXT_RUN, ["%(queues)s", "{backends}"], ["{names}"], ["%(names)s"])
    assert text.count("%%(queues)s") == 1 and "{backends}" in text and "{names}" in text
    assert "%(names)s" not in text.replace("%%(names)s", "")


# -- 3. no session state on the worker's connections -----------------------------------


def test_claims_and_outcomes_leave_no_session_setting_behind():
    jobs.add.perform_later(1)
    worker = Worker(concurrency=1, install_signals=False)
    assert worker.db.open_first()
    try:
        claimed = worker.claimer.claim(worker.handler_names(), 1)
        assert len(claimed) == 1
        conn = worker.db.current()
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        # The one prepared statement is the claim itself, psycopg's (none where prepared statements are off).
        prepared = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
        assert len(prepared) == 1 and "UPDATE ONLY axa_queue q" in prepared[0][0], prepared
    finally:
        worker.db.close()


def test_the_claim_and_the_finish_skip_the_wal_flush_of_their_own_transaction():
    # Each sets synchronous_commit off once (an InitPlan), for its transaction alone:
    # seen here inside a transaction held open around the statement.
    job = jobs.add.perform_later(1)
    worker = Worker(concurrency=1, install_signals=False)
    statement = sql.compose(sql.CLAIM_FULL, worker.handler_names(), [], None)
    outcome = json.dumps([{"id": str(job.pk), "status": "completed", "result": {"v": 3}, "started": 1.0}])
    with connect("default", "test") as conn:
        with conn.transaction():
            rows = conn.execute(statement, {"worker": worker.id, "limit": 5, "ahead": False}).fetchall()
            assert [row[0] for row in rows if row[0] is not None] == [job.pk]
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
        with conn.transaction():
            done = conn.execute(sql.FINISH, {"outcomes": outcome, "worker": worker.id}).fetchall()
            assert [row[1] for row in done] == [[]]  # one row, no outcome left unwritten
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    assert fresh(job).status == "completed" and fresh(job).result == 3


def test_an_empty_claim_takes_no_transaction_id_and_reports_one_above_every_id_given_before_it():
    # worker/lanes.py's cap needs an id above every id given before the claim began; a
    # claim's own id (taken by an empty claim too) cost an id and a commit record a poll.
    worker = Worker(concurrency=1, install_signals=False)
    statement = sql.compose(sql.CLAIM_LANES, worker.handler_names(), [], None, lanes=[0])
    params = {"worker": worker.id, "limit": 5, "ahead": False, "floors": "{-infinity,-infinity,-infinity}"}
    with connect("default", "test") as conn, connect("default", "writer") as writer:
        writer.autocommit = False
        (running,) = writer.execute("SELECT pg_current_xact_id()::text::int8").fetchone()  # the newest running id
        with conn.transaction():
            rows = conn.execute(statement, params).fetchall()
            assert [row[0] for row in rows] == [None]  # only the snapshot's row
            assert conn.execute("SELECT pg_current_xact_id_if_assigned() IS NULL").fetchone()[0]
        xmin, above = rows[0][12], rows[0][13]
        assert xmin <= running < above  # the running writer is seen below it
        (after,) = conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()
        assert above <= after
        writer.rollback()


def test_an_idle_claim_is_one_statement_when_no_queue_has_a_limit():
    # The claim of limited queues, not tried (no queue has a limit), was noted as found
    # empty: the dispatcher then tried every kind again at once, two claims per empty one.
    worker = Worker(concurrency=2, install_signals=False)
    assert worker.db.open_first()
    try:
        assert worker.claimer.claim(["tests.testapp.jobs.add"], 2) == []
        assert not worker.claimer.quiet.any()  # no kind is skipped, so none is tried again
    finally:
        worker.db.close()


# -- 4.1 / 4.5 statements whose LIMIT must hold under any plan; queues stay apart -------


@pytest.mark.parametrize("forced", ["enable_hashjoin", "enable_mergejoin", "enable_seqscan", "enable_bitmapscan"])
def test_the_claim_takes_no_more_than_its_limit_under_forced_plans(forced):
    jobs.add.perform_later_many([{"a": i} for i in range(300)])
    worker = Worker(concurrency=4, install_signals=False)
    assert worker.db.open_first()
    try:
        conn = worker.db.current()
        conn.execute("SET enable_hashjoin = off")
        conn.execute("SET enable_mergejoin = off")
        conn.execute(f"SET {forced} = off")
        claimed = worker.claimer.claim(["tests.testapp.jobs.add"], 3)
    finally:
        worker.db.close()
    assert len(claimed) == 3
    assert Job.objects.filter(status="running").count() == 3


@pytest.mark.halved
def test_a_queue_workers_claim_never_walks_other_queues():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue) SELECT gen_random_uuid(), 'CountWorker', '{}', 'default' "
            "FROM generate_series(1, 200000)"
        )
    jobs.count.using(queue="b").perform_later(fail=False)
    with connect("default", "test") as conn:
        conn.execute("ANALYZE axa_queue")
        query = sql.compose(sql.CLAIM, ["CountWorker"], [], ["b"])
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + psycopg.sql.SQL(query),
                {"worker": None, "limit": 4, "ahead": False},
            )
        )
        conn.rollback()
    assert "axa_queue_claim_all_queue" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
    assert Job.objects.filter(queue="b", status="running").count() == 1


def test_a_lost_workers_rows_keep_their_error_history_as_json():
    job = jobs.add.using(max_losses=2).perform_later(1)
    dead = "00000000-0000-0000-0000-000000000001"
    started = timezone.now()
    rescue = {"lease": 1.0, "stale": 60, "max_losses": 3}
    Job.objects.filter(pk=job.pk).update(status="running", worker_id=dead, attempts=1, started_at=started)
    with connect("default", "test") as conn:
        rows = conn.execute(sql.RESCUE, rescue).fetchall()
    assert rows == [(job.pk, "queued")]
    assert (fresh(job).attempts, fresh(job).losses) == (0, 1)  # the attempt given back, the loss counted
    Job.objects.filter(pk=job.pk).update(status="running", worker_id=dead, attempts=1, started_at=started)
    with connect("default", "test") as conn:
        rows = conn.execute(sql.RESCUE, rescue).fetchall()
    assert rows == [(job.pk, "failed")]
    row = fresh(job)
    assert (row.attempts, row.losses) == (1, 2)
    assert [entry["type"] for entry in row.errors] == ["WorkerLost", "WorkerLost"]
    assert "stopped 2 times (max_losses 2)" in row.error
    assert "loss 1 of 2 allowed" in row.errors[0]["message"] and "loss 2 of 2" in row.errors[1]["message"]
    json.dumps(row.errors)


def test_a_seed_row_past_stale_minutes_is_queued_again_however_often_it_was_lost():
    # Rows the seed's CLAIM took (no worker id) keep the seed's rule: queued again, never failed here.
    job_id = insert_row("tests.testapp.jobs.add", '{"a": 1}', status="'running'", losses="7", max_losses="1")
    Job.objects.filter(pk=job_id).update(started_at=timezone.now() - datetime.timedelta(minutes=61))
    with connect("default", "test") as conn:
        rows = conn.execute(sql.RESCUE, {"lease": 1.0, "stale": 60, "max_losses": 3}).fetchall()
    assert rows == [(job_id, "queued")]
    row = Job.objects.get(pk=job_id)
    assert (row.status, row.attempts, row.losses, row.started_at) == ("queued", 0, 8, None)


def test_the_admin_shows_rows_python_cannot_decode(workers, admin_client):
    deep = insert_row("tests.testapp.jobs.add", '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}")
    huge = insert_row("tests.testapp.jobs.add", '{"a": ' + "7" * 5_000 + "}")
    never = insert_row("tests.testapp.jobs.add", '{"a": 1}', run_at="'infinity'")
    early = insert_row("tests.testapp.jobs.add", '{"a": 1}', run_at="'-infinity'")
    code, output = burst(workers, "--concurrency", "2")
    assert code == 0, output
    for url in ["/admin/axa_django/job/", "/admin/axa_django/failedjob/", "/admin/axa_django/queuedashboard/"]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
    for pk in (deep, huge, never, early):
        response = admin_client.get(f"/admin/axa_django/job/{pk}/change/")
        assert response.status_code == 200, pk


def test_a_row_python_cannot_decode_loads_as_its_text_and_saves_unchanged():
    from axa_django.models import Undecodable

    text = '{"a": ' + "7" * 5_000 + "}"
    pk = insert_row("tests.testapp.jobs.add", text)
    job = Job.objects.get(pk=pk)
    assert isinstance(job.args, Undecodable) and "7777" in job.args
    job.priority = 3
    job.save()
    with connection.cursor() as cursor:
        cursor.execute("SELECT args::text = %s::jsonb::text, priority FROM axa_queue WHERE id = %s", [text, pk])
        assert cursor.fetchone() == (True, 3)


# Times Python cannot hold, as another producer or psql may write them.
OUT_OF_RANGE = {"before": "'0044-03-15 BC'", "minus_infinity": "'-infinity'", "after": "'20000-01-01'"}


@pytest.mark.parametrize("column", ["created_at", "updated_at", "started_at", "finished_at"])
@pytest.mark.parametrize("value", OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
def test_the_admin_and_the_orm_load_a_time_python_cannot_hold_and_the_worker_runs_the_row(
    workers, admin_client, column, value
):
    # Loading such a time failed the whole query: the admin's job list answered 500.
    pk = insert_row("tests.testapp.jobs.add", '{"a": 1, "b": 2}', **{column: value})
    for url in ["/admin/axa_django/job/", "/admin/axa_django/queuedashboard/", f"/admin/axa_django/job/{pk}/change/"]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
    shown = getattr(Job.objects.get(pk=pk), column)
    assert isinstance(shown, datetime.datetime)
    assert shown.year == (9999 if value == OUT_OF_RANGE["after"] else 1), shown
    code, output = burst(workers, "--concurrency", "2")
    assert code == 0, output
    row = Job.objects.get(pk=pk)
    assert row.status == "completed" and row.result == 3, (row.status, row.error)
    assert Job.objects.filter(status="completed").count() == 1
    response = admin_client.get("/admin/axa_django/job/")
    assert response.status_code == 200


def test_a_time_python_cannot_hold_is_shown_as_the_nearest_and_never_saved_back(settings):
    from axa_django.models import OutOfRange

    pk = insert_row("tests.testapp.jobs.add", '{"a": 1}', created_at="'0044-03-15 BC'", started_at="NULL")
    job = Job.objects.get(pk=pk)
    assert isinstance(job.created_at, OutOfRange) and job.created_at == datetime.datetime.min.replace(
        tzinfo=datetime.UTC
    )
    assert job.started_at is None  # NULL stays NULL
    assert Job.objects.filter(pk=pk).values_list("created_at", flat=True).get().year == 1
    job.priority = 3
    job.save()  # writes the priority alone: the time it could not load is left as it is
    with pytest.raises(ValueError, match="created_at was read as 0001-01-01T00:00:00"):
        job.save(update_fields=["created_at", "priority"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT created_at::text, priority FROM axa_queue WHERE id = %s", [pk])
        assert cursor.fetchone() == ("0044-03-15 00:00:00+00 BC", 3)  # the nearest time never written
    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    connection.close()  # the next connection takes the session time zone from the settings
    naive = Job.objects.get(pk=pk).created_at
    assert isinstance(naive, OutOfRange) and naive == datetime.datetime.min  # local time, and still loadable


@pytest.mark.parametrize("value", ["'20000-01-01'", "'infinity'"])
def test_a_row_due_after_year_9999_fails_as_never_due_saying_when_and_the_admin_shows_it(workers, admin_client, value):
    pk = insert_row("tests.testapp.jobs.add", '{"a": 1, "b": 2}', run_at=value)
    assert admin_client.get("/admin/axa_django/job/").status_code == 200  # before the worker failed it
    proc = workers.start("--concurrency", "1")
    wait_for(lambda: Job.objects.get(pk=pk).status == "failed", what="the never-due row failed")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    row = Job.objects.get(pk=pk)
    expected = "'infinity'" if value == "'infinity'" else "20000-01-01 00:00:00+00"
    assert (
        row.error == f"NeverDue: run_at was {expected}, so this job could never run; enqueue it again with a real time"
    )
    assert row.run_at.year >= 2000
    assert admin_client.get(f"/admin/axa_django/job/{pk}/change/").status_code == 200


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
def test_the_admin_shows_times_python_cannot_hold_in_any_time_zone(admin_client, settings, zone, use_tz):
    # The nearest time Python holds, moved into a zone west or east of UTC, leaves that range.
    settings.USE_TZ, settings.TIME_ZONE = use_tz, zone
    connection.close()  # the next connection takes the session time zone from the settings
    early = insert_row("tests.testapp.jobs.add", '{"a": 1}', created_at="'0044-03-15 BC'", run_at="'-infinity'")
    late = insert_row("tests.testapp.jobs.add", '{"a": 1}', updated_at="'20000-01-01'", finished_at="'infinity'")
    for url in [
        "/admin/axa_django/job/",
        f"/admin/axa_django/job/{early}/change/",
        f"/admin/axa_django/job/{late}/change/",
    ]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
