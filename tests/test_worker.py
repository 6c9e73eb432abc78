"""The worker, in-process and as real subprocesses: the seed's behaviours and more."""

import signal
import threading
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from axa_django import Job, enqueue
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def burst(**options):
    options.setdefault("concurrency", 2)
    worker = Worker(burst=True, install_signals=False, **options)
    assert worker.run() == 0
    return worker


def status(job):
    job.refresh_from_db()
    return job.status


def test_empty_queue_has_nothing_to_run():
    assert burst().processed == 0


def test_a_job_runs_and_is_completed_with_its_result():
    job = jobs.add.perform_later(40, b=2)
    assert burst().processed == 1
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts, job.error) == ("completed", 42, 1, None)
    assert job.started_at <= job.finished_at and job.worker_id is not None


def test_a_failure_is_kept_on_the_row_and_does_not_stop_the_worker():
    bad = jobs.count.perform_later(fail=True)
    good = jobs.count.perform_later(fail=False)
    assert burst().processed == 2
    bad.refresh_from_db()
    assert bad.status == "failed"
    assert "RuntimeError: told to fail" in bad.error and "Traceback" in bad.error
    assert bad.errors[0]["type"] == "builtins.RuntimeError" and bad.errors[0]["message"] == "told to fail"
    assert status(good) == "completed"


def test_args_that_do_not_fit_fail_the_job_not_the_worker():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'CountWorker', %s)", ['{"wrong": 1}']
        )
        cursor.execute("INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'CountWorker', '[1, 2]')")
    assert burst().processed == 2
    not_object, wrong = sorted(Job.objects.all(), key=lambda j: str(j.args))
    assert wrong.status == not_object.status == "failed"
    assert "the arguments do not fit CountWorker(fail: bool): unexpected argument(s) 'wrong'" in wrong.error
    assert "args must be a JSON object of parameter name -> value, not list" in not_object.error


def test_a_job_with_no_handler_stays_queued():
    job = enqueue("OtherWorker", fail=False)
    assert burst().processed == 0
    assert status(job) == "queued"


def test_a_dotted_path_of_an_unregistered_function_is_never_imported(tmp_path):
    # os.remove is a real function; a worker that imported names would run it.
    victim = tmp_path / "keep.txt"
    victim.write_text("x")
    job = enqueue("os.remove", path=str(victim))
    assert burst().processed == 0
    assert status(job) == "queued" and victim.exists()


def test_stale_jobs_are_requeued_at_start_and_recent_ones_left_alone():
    stale = jobs.count.perform_later(fail=False)
    recent = jobs.count.perform_later(fail=False)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axa_queue SET status = 'running', started_at = now() - interval '2 hours' WHERE id = %s", [stale.pk]
        )
        cursor.execute("UPDATE axa_queue SET status = 'running', started_at = now() WHERE id = %s", [recent.pk])
    assert burst().processed == 1
    assert status(stale) == "completed"
    assert status(recent) == "running"


def test_concurrent_loops_run_each_job_exactly_once(log_file):
    jobs.record.perform_later_many([{"token": str(i), "log": log_file} for i in range(200)])
    assert burst(concurrency=8).processed == 200
    assert Counter(Path(log_file).read_text().split()) == Counter(str(i) for i in range(200))
    assert not Job.objects.exclude(status="completed").exists()


def test_retries_with_backoff_then_completes(log_file):
    job = jobs.flaky.perform_later(log=log_file)
    burst()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == ("completed", 3, 3)
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert all(e["type"] == "builtins.ValueError" and e["traceback"] for e in job.errors)


def test_last_attempt_failure_marks_failed_with_every_attempt_kept():
    job = jobs.count.using(max_attempts=2).perform_later(fail=True)
    with connection.cursor() as cursor:  # retry at once rather than after the default backoff
        cursor.execute("UPDATE axa_queue SET max_attempts = 2 WHERE id = %s", [job.pk])
    worker = Worker(burst=True, install_signals=False, concurrency=1)
    worker.run()
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 1 and job.run_at > job.updated_at
    Job.objects.filter(pk=job.pk).update(run_at=job.created_at)
    burst()
    job.refresh_from_db()
    assert job.status == "failed" and job.attempts == 2 and len(job.errors) == 2


def test_non_json_return_fails_the_job_clearly():
    job = jobs.bad_result.perform_later()
    burst()
    job.refresh_from_db()
    assert job.status == "failed"
    assert "the return value of job 'tests.testapp.jobs.bad_result' is a set, which is not JSON" in job.error


def test_context_gives_attempt_and_id():
    job = jobs.with_context.perform_later()
    burst()
    job.refresh_from_db()
    assert job.result == {"attempt": 1, "cancelled": False, "id": str(job.pk)}


def test_max_jobs_stops_after_that_many():
    jobs.add.perform_later_many([{"a": i} for i in range(10)])
    worker = Worker(max_jobs=3, concurrency=2, install_signals=False)
    assert worker.run() == 0
    assert Job.objects.filter(status="completed").count() == 3, (
        worker.processed,
        list(Job.objects.values_list("status", "attempts")),
    )


def test_stop_lets_a_running_job_finish(log_file):
    job = jobs.slow.perform_later(0.5, log=log_file)
    worker = Worker(concurrency=1, install_signals=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    # Begun in a thread, not only claimed ("running" in the row): a stop gives a claimed job
    # that no thread has taken back to the queue, and the row was seen so at times in CI.
    wait_for(lambda: "start" in Path(log_file).read_text(), what="job to start in a thread")
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert status(job) == "completed"


def test_worker_claims_only_the_names_it_is_given():
    add = jobs.add.perform_later(1)
    count = jobs.count.perform_later(fail=False)
    burst(names=["CountWorker"])
    assert (status(add), status(count)) == ("queued", "completed")


def test_bad_worker_options_are_refused():
    for options, message in [
        ({"concurrency": 0}, "concurrency must be a positive whole number, not 0"),
        ({"concurrency": -1}, "concurrency must be a positive whole number, not -1"),
        ({"poll_interval": 0}, "poll_interval must be a positive number of seconds, not 0"),
        ({"max_jobs": 0}, "max_jobs must be a positive whole number, not 0"),
        ({"grace_period": -1}, "grace_period must be a number of seconds >= 0, not -1"),
    ]:
        with pytest.raises(ValueError) as raised:
            Worker(**options)
        assert str(raised.value) == message


# -- real subprocesses ------------------------------------------------------------


def test_three_worker_processes_run_2000_jobs_each_exactly_once(workers, log_file):
    jobs.record.perform_later_many([{"token": str(i), "log": log_file} for i in range(2000)])
    procs = [workers.start("--concurrency", "4", "--burst") for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    # Which worker won how many claims is luck (the first can drain all 2,000 before the
    # others connect); every job once, and every worker exiting cleanly, is the promise.
    assert Counter(Path(log_file).read_text().split()) == Counter(str(i) for i in range(2000))
    assert Job.objects.filter(status="completed", attempts=1).count() == 2000


@pytest.mark.halved
def test_eight_workers_booting_together_all_start_and_exit_cleanly(workers):
    jobs.add.perform_later_many([{"a": i} for i in range(50)])
    procs = [workers.start("--burst", "--concurrency", "1") for _ in range(8)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert Job.objects.filter(status="completed").count() == 50


def test_sigterm_during_a_slow_job_lets_it_finish_then_exits_zero(workers, log_file):
    job = jobs.slow.perform_later(1.5, log=log_file, token="t")
    proc = workers.start("--concurrency", "2", env=workers.env(AXA_LOG_LEVEL="INFO"))
    wait_for(lambda: "start t" in Path(log_file).read_text(), what="slow job to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    output = proc.stdout.read()
    assert "finishing jobs in progress" in output
    assert "end t" in Path(log_file).read_text()
    assert status(job) == "completed"


def test_worker_logs_its_start_and_each_failure(workers):
    job = jobs.count.perform_later(fail=True)
    proc = workers.start("--burst", env=workers.env(AXA_LOG_LEVEL="INFO"))
    assert proc.wait(timeout=60) == 0
    output = proc.stdout.read()
    assert (
        "starting: concurrency 4" in output
        and "CountWorker" in output
        and f"database {connection.settings_dict['NAME']}" in output
    )
    assert f"job CountWorker {job.pk} failed: told to fail" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
        (["--concurrency", "-2"], "argument --concurrency: must be at least 1, got -2"),
        (["--concurrency", "many"], "argument --concurrency: expected a whole number, got 'many'"),
        (["--poll-interval", "soon"], "argument --poll-interval: expected a number of seconds, got 'soon'"),
        (["--poll-interval", "0"], "argument --poll-interval: must be a positive number of seconds, got 0"),
        (["--max-jobs", "0"], "argument --max-jobs: must be at least 1, got 0"),
        (["--grace-period", "-1"], "argument --grace-period: must be a number of seconds, got -1"),
    ],
)
def test_runworker_rejects_bad_options(workers, args, message):
    result = workers.manage("runworker", *args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.halved
def test_runworker_on_an_unmigrated_database_says_to_migrate(workers):
    with connection.cursor() as cursor:
        cursor.execute("CREATE DATABASE axa_unmigrated")
    try:
        env = workers.env()
        name = connection.settings_dict["NAME"]
        env["DATABASE_URL"] = env["DATABASE_URL"].replace(f"/{name}", "/axa_unmigrated")
        proc = workers.start("--burst", env=env)
        assert proc.wait(timeout=60) == 2
        assert (
            "CommandError: the queue tables do not exist in database 'axa_unmigrated': run python manage.py migrate first"
            in proc.stdout.read()
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP DATABASE axa_unmigrated WITH (FORCE)")


def test_names_and_queues_with_quotes_and_percent_signs_are_claimed(log_file):
    from axa_django import background_job
    from axa_django.registry import registry

    odd = background_job(name="it's 100% odd")(jobs.record.func)
    try:
        job = odd.using(queue="q'%s").perform_later(token="odd", log=log_file)
        assert burst(queues=["q'%s"]).processed == 1
        assert status(job) == "completed"
    finally:
        registry.pop("it's 100% odd")


@pytest.mark.django_db(transaction=True)
def test_a_workers_row_records_the_names_it_claims(workers):
    from axa_django.models import Worker as WorkerRow

    proc = workers.start("--job", "tests.testapp.jobs.add", "--job", "CountWorker")
    row = wait_for(lambda: WorkerRow.objects.filter(pid=proc.pid).first(), what="the worker's row")
    assert row.names == ["CountWorker", "tests.testapp.jobs.add"] and row.backends == []
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
