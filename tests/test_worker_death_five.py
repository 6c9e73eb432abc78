"""Fifth review: the stuck limit's graceful stop (7fe6aa7), the stop's join loop (12a0ce8) and runworker's
os._exit past stuck threads (b893150, bdc8d6c), attacked with real workers. Each test says what it showed."""

import re
import signal
import time

import pytest

from tests.conftest import AXA_APPS, wait_for
from tests.test_flow_timeout import Output, a_fifo, fifo  # noqa: F401  (fifo: a fixture)
from tests.test_reliability import fresh, lines
from tests.test_worker_death import exited
from tests.test_worker_death_held import given_up_once
from tests.testapp import flow_jobs, hostile_jobs


@pytest.fixture
def fifos(tmp_path):
    with a_fifo(tmp_path / "f2") as second, a_fifo(tmp_path / "f3") as third:
        yield second, third


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_thread_stuck_during_the_stuck_limits_stop_ends_it_and_the_worker_exits_1(
    workers,
    fifo,  # noqa: F811 - the fixture imported
    fifos,
):
    # The stuck limit stops as a first signal does; the watchdog runs on through the stop. A replacement
    # thread whose own job gets stuck during that stop is given up (count past the limit: fail() again, no
    # replacement), its job no longer held: the stop ends, the worker exits 1 (disproof: no wait for ever).
    second, third = fifos
    proc, output = given_up_once(workers, fifo)
    later = flow_jobs.blocked.using(timeout=2.5).perform_later(str(second))  # stuck during the stop
    limit = flow_jobs.blocked.perform_later(str(third))  # reaches the limit
    wait_for(lambda: fresh(limit).status == "failed", what="the limit reached")
    assert fresh(later).status == "running"
    code = exited(proc, 20)
    said = "\n".join(output.lines)
    assert code == 1, (code, said[-2500:])
    assert fresh(later).status == "failed", said[-2500:]
    assert any("stopped" in line for line in output.lines), said[-2500:]


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_per_queue_pools_exit_1_past_an_async_thread_stuck_at_one_pools_limit_the_others_job_finished_once(
    workers,
    fifo,  # noqa: F811 - the fixture imported
    log_file,
):
    # Pools: pool a (1 thread) reaches its stuck limit on an async job whose loop thread (concurrent.futures,
    # joined at exit) never ends; Pools stops pool b gracefully, its running job finishes (not given back),
    # Pools.run() returns 1 and runworker's check over every member leaves by os._exit(1).
    env = workers.env(AXA_LOG_LEVEL="INFO")
    proc = workers.start("--new-queue", "qa:1", "--new-queue", "qb:1", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    long = hostile_jobs.exclusive.using(queue="qb").perform_later(4.0, log_file)
    wait_for(lambda: lines(log_file), what="pool b's job started")
    stuck = hostile_jobs.async_blocked.using(queue="qa").perform_later(str(fifo))
    wait_for(lambda: fresh(stuck).status == "failed", what="the async attempt given up")
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    assert code == 1, (code, said[-2500:])
    assert fresh(long).status == "completed" and fresh(long).attempts == 1, said[-2500:]
    assert lines(log_file) == [f"start {proc.pid} alone", f"end {proc.pid}"], (lines(log_file), said[-2500:])
    assert sum(bool(re.search(r"worker [0-9a-f-]{36} stopped", line)) for line in output.lines) == 2, said[-2500:]


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_reload_mode_exits_0_at_sigterm_past_an_async_thread_stuck(
    workers,
    fifo,  # noqa: F811 - the fixture imported
):
    # --reload: the child runs reloading.serve(worker) (the worker on a thread of its own); past a stuck async
    # job it must leave by os._exit too, and the parent, its SIGTERM forwarded, return the child's 0.
    env = workers.env(AXA_LOG_LEVEL="INFO")
    proc = workers.start("--reload", "--concurrency", "2", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    wait_for(lambda: output.has("watching for code changes"), timeout=30, what="the reloader")
    stuck = hostile_jobs.async_blocked.perform_later(str(fifo))
    wait_for(lambda: fresh(stuck).status == "failed", what="the async attempt given up")
    wait_for(lambda: output.has("its thread is stuck; starting a new job thread"), what="the replacement")
    proc.send_signal(signal.SIGTERM)
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    assert code == 0, (code, said[-2500:])
    assert any("stopped after" in line for line in output.lines), said[-2500:]


CALLER = """
import sys
import django
django.setup()
from django.core.management import call_command
try:
    call_command("runworker", *sys.argv[1:])
finally:
    print("call_command returned", flush=True)
"""


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_call_command_runworker_returns_to_its_caller_past_a_stuck_sync_thread(
    workers,
    fifo,  # noqa: F811 - the fixture imported
):
    # runworker leaves by os._exit whenever a stuck job thread lives, even one that could never hold the exit
    # (a sync job's thread is a daemon): a program that runs the worker in its own process (call_command, a
    # burst run in a script or a test) is ended under its feet, its own code after the call never run.
    import subprocess
    import sys

    from tests.conftest import ROOT

    stuck = flow_jobs.blocked.perform_later(str(fifo))
    proc = subprocess.Popen(
        [sys.executable, "-c", CALLER, "--burst", "--concurrency", "2", "--timeout-grace", "0.2", "-v", "1"],
        cwd=ROOT,
        env=workers.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers.procs.append(proc)
    code = exited(proc, 30)
    said = proc.stdout.read() if code is not None else ""
    assert fresh(stuck).status == "failed", said[-2500:]
    assert code == 0 and "call_command returned" in said, (code, said[-2500:])


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_first_sigterm_during_the_stuck_limits_stop_does_not_abort_the_running_job(
    workers,
    fifo,  # noqa: F811 - the fixture imported
    fifos,
    log_file,
):
    # The stuck limit's stop is control.fail(): a stop, not a signal. A process manager's SIGTERM that comes
    # during it is the process's first signal (Signals counts signals, not stops): a stop again, no abort;
    # the long job its other thread runs finishes, not given back while it runs (disproof).
    second, _ = fifos
    proc, output = given_up_once(workers, fifo)
    long = hostile_jobs.exclusive.perform_later(4.0, log_file)
    wait_for(lambda: lines(log_file), what="the long job's start")
    limit = flow_jobs.blocked.perform_later(str(second))
    wait_for(lambda: output.has("stuck in jobs past their timeout"), what="the limit reached")
    proc.send_signal(signal.SIGTERM)
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    assert fresh(limit).status == "failed"
    assert code == 1, (code, said[-2500:])
    assert fresh(long).status == "completed" and fresh(long).attempts == 1, said[-2500:]
    assert lines(log_file) == [f"start {proc.pid} alone", f"end {proc.pid}"], (lines(log_file), said[-2500:])
    assert "again: giving jobs in progress back" not in said


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_stop_joining_a_hung_maintenance_thread_still_ends_at_its_grace_period(workers, tmp_path):
    # The stop joined its threads in steps without looking again at the abort: the grace period running out
    # while it joined a thread that does not return (the maintenance thread in a statement that never
    # answers) left the worker waiting for that thread, past the grace period (the fifth review's note).
    flag = tmp_path / "maintenance"
    env = workers.env(AXA_TEST_SLOW_MAINTENANCE="30", AXA_TEST_MAINTENANCE_FLAG=str(flag))
    proc = workers.start("--grace-period", "1", env=env)
    output = Output(proc)
    wait_for(flag.exists, what="the maintenance round hung")
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = exited(proc, 20)
    took = time.monotonic() - began
    assert code == 1 and took < 10, (code, round(took, 1), "\n".join(output.lines)[-2000:])
    assert output.has("grace period over"), "\n".join(output.lines)[-2000:]
