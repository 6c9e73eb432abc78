"""A stop that gives back the jobs held once no job thread is alive must give back none a thread still runs,
nor one that ran. From the second review of that change (f37c8f9); each test says what it showed."""

import os
import signal
import time

import pytest
from django.db import connection, transaction

from axa_django.models import Job
from tests.conftest import AXA_APPS, wait_for
from tests.test_flow_timeout import Output, a_fifo, fifo, release  # noqa: F401  (fifo: a fixture)
from tests.test_reliability import fresh, lease, lines
from tests.test_worker_death import exited, listening
from tests.testapp import flow_jobs, hostile_jobs, jobs

PROBE = "tests.testapp.hostile_jobs.probe_stuck_ident"
DIE_AFTER = "tests.testapp.hostile_jobs.finish_then_die"
SLOW = "tests.testapp.jobs.slow"


def row(job: Job) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, attempts, worker_id IS NULL FROM axa_queue WHERE id = %s", [job.pk])
        return cursor.fetchone()


def stop_while_probed(proc, log_file: str, probes: list) -> tuple[int | None, list]:
    """SIGTERM ``proc`` while its stop's last statement (UNREGISTER) waits on a lock on its axa_worker row
    (3 s at most), so that its exit cannot end a probe given back before another worker starts it; its exit
    code and the probes' rows (status, attempts, worker_id IS NULL) at the stop."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM axa_worker WHERE pid = %s FOR UPDATE", [proc.pid])
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any("overlap" in line for line in lines(log_file)):
            time.sleep(0.02)
        rows = [(p.pk, row(p)) for p in probes]
    return exited(proc, 30), rows


def given_up_once(workers, path, env=None) -> tuple:
    """A worker of two job threads, one of them given up stuck in a job and replaced: (process, its output)."""
    proc = workers.start("--concurrency", "2", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    first = flow_jobs.blocked.perform_later(str(path))
    wait_for(lambda: fresh(first).status == "failed", what="the first stuck attempt given up")
    wait_for(lambda: output.has("starting a new job thread in its place"), what="the replacement")
    return proc, output


@pytest.fixture
def fifo2(tmp_path):
    with a_fifo(tmp_path / "fifo2") as path:
        yield path


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_graceful_stop_does_not_give_back_the_job_a_replacement_thread_runs_when_it_reuses_a_stuck_threads_ident(
    workers,
    log_file,
    fifo,  # noqa: F811 - the fixture imported
    fifo2,
    tmp_path,
):
    # JobThreads.alive() asks ledger.is_stuck(thread.ident); ledger._stuck keeps the idents of every
    # thread ever given up. A given-up thread that later returns (its C call ends) exits, and its
    # ident (pthread_self: glibc reuses the freed stack) goes to the next thread the process starts:
    # the next replacement job thread. That live thread then counts as stuck: at a SIGTERM, once the
    # other job threads have taken their None, alive() is False while it still runs its job, and
    # unclaim_held() UNCLAIMs that running job (queued, attempt given back). The stop then skips
    # joining it (is_stuck) and the process exits mid-job, exit 0.
    # A lease of 10 s (the workers'): the row lock below holds the first worker's beats up to 3 s.
    env = workers.env(AXA_TEST_LEASE="10")
    proc = workers.start("--concurrency", "3", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    first = flow_jobs.blocked.perform_later(str(fifo))
    wait_for(lambda: fresh(first).status == "failed", what="the first stuck attempt given up")
    idents = str(tmp_path / "idents")
    noted = hostile_jobs.write_stuck_idents.perform_later(idents)
    wait_for(lambda: fresh(noted).status == "completed", what="the stuck thread's ident written")
    threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    release(fifo)
    wait_for(lambda: output.has("returned after it was given up"), what="the stuck thread's late return (it exits)")
    # Its ident (its stack) is free once the thread is gone.
    wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) < threads, what="the late thread gone")
    second = flow_jobs.blocked.perform_later(str(fifo2))
    wait_for(lambda: fresh(second).status == "failed", what="the second stuck attempt given up (a new replacement)")
    # Three live job threads now: one probe each. Only a thread with the given-up thread's ident runs long:
    # on the code before, the ledger counted it stuck.
    long = 12.0
    probes = [hostile_jobs.probe_stuck_ident.perform_later(log_file, idents, long, 1.0) for _ in range(3)]
    wait_for(lambda: len(lines(log_file)) >= 3, what="the probes' starts")
    starts = [line for line in lines(log_file) if line.startswith("start")]
    marked = [line for line in starts if "reused=True" in line]
    if not marked:
        pytest.skip(f"no live job thread reused a stuck thread's ident this time: {starts}")
    # Another worker that runs only the probes, listening: a probe given back now is claimed at once.
    other = workers.start("--concurrency", "1", "--job", PROBE, env=env)
    wait_for(lambda: listening(2), what="both workers listening")
    code, rows = stop_while_probed(proc, log_file, probes)
    said = "\n".join(output.lines)
    ran = lines(log_file)
    print("exit", code, "runs:", *ran, "rows (status, attempts, worker_id IS NULL) at the stop:", *rows, sep="\n")
    assert "no job thread was left to run back to the queue" not in said, (code, marked, ran, rows, said[-1500:])
    assert not any("overlap" in line for line in ran), ran
    assert code == 0 and len([line for line in ran if line.startswith("end")]) == 3, (code, ran, rows)
    assert other.poll() is None


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_job_thread_dying_after_its_job_ran_does_not_have_the_job_given_back_and_run_again(workers, log_file):
    # A job thread dies outside its job after ledger.finished() handed the outcome to the finisher and
    # before ledger.release(): here a job_finished receiver raising SystemExit (send_robust catches
    # Exception only; loop() catches Exception around send_finished). The job ran and completed; it is
    # still held. unclaim_held() UNCLAIMs it (queued, attempt given back, no error entry) if it runs
    # before the finisher's FINISH; the FINISH then finds the row changed and is not written. The
    # job runs again: twice, silently, its first attempt erased. The FINISH is held back by a lock on
    # axa_history (FINISH inserts there; UNCLAIM does not touch it), which makes that order certain;
    # without it the two race (a COALESCE of 0.5 ms against the thread's death and the stop's steps).
    env = workers.env(AXA_TEST_DIE_AFTER_FINISH="1")
    proc = workers.start("--concurrency", "1", env=env)
    output = Output(proc)
    job = hostile_jobs.finish_then_die.perform_later(log_file, 1.0)
    wait_for(lambda: fresh(job).status == "running", what="the job's start")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE axa_history IN SHARE MODE")
        wait_for(lambda: output.has("worker thread axa-job-0 died"), what="the job thread's death")
        # The stop gives back the held job within a moment (no job thread left).
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and row(job)[0] == "running":
            time.sleep(0.02)
        after_unclaim = row(job)
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    workers.start("--concurrency", "1", "--job", DIE_AFTER)  # without the receiver's fault
    wait_for(lambda: fresh(job).status == "completed", timeout=6 * lease(), what="the job's completion")
    ran = lines(log_file)
    assert len(ran) == 1, (after_unclaim, code, ran, fresh(job).attempts, said[-3000:])


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_job_thread_dying_after_its_job_ran_races_the_finisher_unhindered(workers, log_file):
    # The same fault with no lock: how often the race is lost in a plain run (reported, then asserted).
    env = workers.env(AXA_TEST_DIE_AFTER_FINISH="1")
    runs, twice = 5, 0
    for i in range(runs):
        log = f"{log_file}.{i}"
        open(log, "w").close()
        proc = workers.start("--concurrency", "1", env=env)
        job = hostile_jobs.finish_then_die.perform_later(log, 0.2)
        assert exited(proc, 30) == 1
        status = row(job)
        if status is not None and status[0] == "queued":
            twice += 1
            said = proc.stdout.read()
            print(status, *[line for line in said.splitlines() if "not written" in line or "gave" in line])
        Job.objects.filter(pk=job.pk).delete()
    print(f"\nUNCLAIM beat FINISH in {twice} of {runs} runs")
    assert twice == 0, f"UNCLAIM beat FINISH in {twice} of {runs} runs: a completed job queued again"


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_dead_job_threads_unstarted_job_goes_back_once_and_the_other_threads_job_finishes_first(workers, log_file):
    # Disproof attempt: the designed case. A job thread killed as it takes its job (kill_an_idle_job_thread)
    # while another thread runs a job of 2 leases: the stop waits for that job (alive() true), then gives
    # the dead thread's job back; a second worker runs it once; nothing overlaps.
    slow = hostile_jobs.exclusive.perform_later(2 * lease(), log_file)
    first = workers.start("--concurrency", "3")
    wait_for(lambda: lines(log_file), what="the slow job's start")
    killer = hostile_jobs.kill_an_idle_job_thread.perform_later()
    wait_for(lambda: fresh(killer).status in ("completed", "failed"), what="an idle job thread marked")
    # A second each: the thread that is not marked is busy with one while the marked one takes the other
    # (jobs of no time let one thread run both, and the marked one, never woken, never died: a flake).
    jobs.slow.perform_later_many([{"seconds": 1.0, "token": f"t{i}", "log": log_file + ".v"} for i in range(2)])
    assert exited(first, 60) == 1
    out = first.stdout.read()
    assert "died; stopping the worker once its jobs in progress finish" in out, out[-2000:]
    assert lines(log_file) == [f"start {first.pid} alone", f"end {first.pid}"], (lines(log_file), out[-2000:])
    assert fresh(slow).status == "completed"
    given = "gave 1 job(s) no job thread was left to run" in out
    second = workers.start("--concurrency", "1", "--job", SLOW)
    wait_for(
        lambda: Job.objects.filter(name=SLOW, status="completed").count() == 2, timeout=6 * lease(), what="both run"
    )
    starts = [line.split()[1] for line in lines(log_file + ".v") if line.startswith("start")]
    assert sorted(starts) == ["t0", "t1"], (lines(log_file + ".v"), given)
    done = list(Job.objects.filter(name=SLOW).values_list("status", "attempts"))
    assert done == [("completed", 1), ("completed", 1)], done
    assert second.poll() is None


# From the third review (of 93c14dc, which unstuck a returning thread by its ident): a given-up thread that
# returns while the watchdog is between ``watch.abandon()`` and ``ledger.stuck()`` was counted stuck after it
# had ended, and its ident's next thread with it.
@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_given_up_thread_returning_before_the_watchdog_counts_it_is_not_left_counted_stuck(
    workers,
    log_file,
    fifo,  # noqa: F811 - the fixture imported
    tmp_path,
):
    # _give_up: abandon() -> failure() (logs) -> finished -> release -> stuck(ident). The job thread, its C call
    # ended just after abandon(): settle() False -> unstuck(ident) (nothing to discard yet) -> exits. Then the
    # watchdog adds the dead thread's ident: counted stuck for ever, and the replacement it starts at once
    # (glibc reuses the freed stack: same pthread ident) is "stuck" while it runs jobs. The hostile module
    # holds the watchdog at failure()'s log line until the given-up thread has exited (AXA_TEST_GIVE_UP_RACE).
    env = workers.env(AXA_TEST_LEASE="10", AXA_TEST_GIVE_UP_RACE=str(fifo))
    proc = workers.start("--concurrency", "3", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    first = flow_jobs.blocked.perform_later(str(fifo))
    try:
        wait_for(lambda: fresh(first).status == "failed", what="the stuck attempt given up")
    except AssertionError:
        raise AssertionError("".join(output.lines)[-3000:]) from None
    wait_for(lambda: output.has("starting a new job thread in its place"), what="the replacement")
    assert output.has("returned after it was given up")
    idents = str(tmp_path / "idents")
    noted = hostile_jobs.write_stuck_idents.perform_later(idents)
    wait_for(lambda: fresh(noted).status == "completed", what="the stuck idents written")
    with open(idents) as f:
        phantom = f.read().split()
    live = [t for t in os.listdir(f"/proc/{proc.pid}/task")]
    long = 12.0
    probes = [hostile_jobs.probe_stuck_ident.perform_later(log_file, idents, long, 1.0) for _ in range(3)]
    wait_for(lambda: len(lines(log_file)) >= 3, what="the probes' starts")
    marked = [line for line in lines(log_file) if line.startswith("start") and "reused=True" in line]
    overlap, said, code, rows = False, "", None, []
    if marked:
        other = workers.start("--concurrency", "1", "--job", PROBE, env=workers.env(AXA_TEST_LEASE="10"))
        wait_for(lambda: listening(2), what="both workers listening")
        code, rows = stop_while_probed(proc, log_file, probes)
        said = "\n".join(output.lines)
        overlap = any("overlap" in line for line in lines(log_file))
        print("exit", code, "runs:", *lines(log_file), "rows:", *rows, sep="\n")
        assert other.poll() is None
    print("stuck idents with no thread stuck:", phantom, "threads:", len(live), "reused:", marked)
    assert not overlap and "no job thread was left to run back to the queue" not in said, (
        code,
        lines(log_file),
        rows,
        phantom,
        said[-2500:],
    )
    assert phantom == [], f"the ledger counts {phantom} stuck, yet the given-up thread returned and exited"


# -- From the fourth review (of d234159/c726f5e: stuck threads kept as threads, counted while they live) --------

EXCLUSIVE = "tests.testapp.hostile_jobs.exclusive"


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_the_stuck_limit_does_not_give_back_the_job_a_replacement_thread_runs(
    workers,
    log_file,
    fifo,  # noqa: F811 - the fixture imported
    fifo2,
):
    # The watchdog exits 1 once ledger.stuck() counts concurrency live stuck threads ("every job thread stuck",
    # docs/deployment.md), through control.die(): an abort, RELEASE of every job held. But each earlier give-up
    # started a replacement, which is neither stuck nor idle: with --concurrency 2, the second give-up counts 2
    # while the first one's replacement (or the other thread) runs a job. That job is given back while its
    # thread still runs it, and another worker claims and starts it: twice at once.
    env = workers.env(AXA_TEST_LEASE="10")
    proc, output = given_up_once(workers, fifo, env)
    long = hostile_jobs.exclusive.perform_later(8.0, log_file)
    wait_for(lambda: lines(log_file), what="the long job's start on a live, not stuck, thread")
    other = workers.start("--concurrency", "1", "--job", EXCLUSIVE, env=env)
    wait_for(lambda: listening(2), what="both workers listening")
    # The second give-up reaches the limit; the stop's UNREGISTER waits on the row lock (3 s at most), so
    # that the first worker's exit cannot end the long job before a run given back starts elsewhere.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM axa_worker WHERE pid = %s FOR UPDATE", [proc.pid])
        second = flow_jobs.blocked.perform_later(str(fifo2))
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not any("overlap" in line for line in lines(log_file)):
            time.sleep(0.02)
        at_stop = row(long)
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    ran = lines(log_file)
    print("exit", code, "runs:", *ran, "long job (status, attempts, worker_id IS NULL):", at_stop, sep="\n")
    assert fresh(second).status == "failed" and "stuck in jobs past their timeout" in said, said[-2500:]
    assert not any("overlap" in line for line in ran), (code, ran, at_stop, said[-2500:])
    assert code == 1 and ran[:2] == [f"start {proc.pid} alone", f"end {proc.pid}"], (code, ran, said[-2500:])
    assert other.poll() is None


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_graceful_stop_does_not_join_for_ever_a_thread_given_up_but_not_yet_counted_stuck(
    workers,
    fifo,  # noqa: F811 - the fixture imported
):
    # _give_up: finished -> release -> stuck(thread). Between the last two the job is no longer held and its
    # thread is not counted stuck. A stop that passes then (held() 0, the outcome written) reaches the join
    # loop of _shutdown, which skips only threads is_stuck() already, and joins the given-up thread with no
    # timeout: blocked in C, it may never return; the watchdog counting it a moment later changes nothing.
    # AXA_TEST_SLOW_STUCK holds the watchdog there (a descheduled thread) for 4 s.
    env = workers.env(AXA_TEST_LEASE="10", AXA_TEST_SLOW_STUCK="4")
    proc = workers.start("--concurrency", "2", "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    stuck = flow_jobs.blocked.perform_later(str(fifo))
    wait_for(lambda: fresh(stuck).status == "failed", what="the stuck attempt given up, its outcome written")
    assert not output.has("its thread is stuck")  # the watchdog is still before ledger.stuck()
    proc.send_signal(signal.SIGTERM)
    code = exited(proc, 20)
    said = "\n".join(output.lines)
    assert output.has("its thread is stuck; starting a new job thread"), said[-2000:]
    assert code == 0, (code, said[-2000:])


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("concurrency", [2, 1])
def test_an_async_job_given_up_counts_its_job_thread_stuck_and_the_worker_still_exits(
    workers,
    fifo,  # noqa: F811 - the fixture imported
    tmp_path,
    concurrency,
):
    # An async job's code starts on its job thread (call() -> Watch.enter(): watch.thread is the job thread), then
    # runs on an event loop of asgiref's, in a ThreadPoolExecutor thread, the job thread waiting on it. Blocked
    # in C there, its task cannot be cancelled: given up, the job thread is counted stuck (it is, waiting). But
    # concurrent.futures joins every executor thread at the interpreter's exit (threading._register_atexit),
    # daemon or not, and that of the blocked loop never ends: the worker stops (UNREGISTER) and never exits,
    # at a SIGTERM (--concurrency 2) as at the stuck limit (--concurrency 1, exit 1: no restart ever comes).
    handlers_ran = tmp_path / "atexit"
    env = workers.env(AXA_TEST_ATEXIT_FILE=str(handlers_ran))
    proc = workers.start("--concurrency", str(concurrency), "--timeout-grace", "0.2", "-v", "1", env=env)
    output = Output(proc)
    stuck = hostile_jobs.async_blocked.perform_later(str(fifo))
    wait_for(lambda: fresh(stuck).status == "failed", what="the async attempt given up")
    if concurrency == 2:
        wait_for(lambda: output.has("its thread is stuck; starting a new job thread"), what="the replacement")
        names = str(tmp_path / "names")
        noted = hostile_jobs.write_stuck_names.perform_later(names)
        wait_for(lambda: fresh(noted).status == "completed", what="the stuck threads' names written")
        with open(names) as f:
            counted = f.read().split()
        assert len(counted) == 1 and counted[0].startswith("axa-job-"), counted
        proc.send_signal(signal.SIGTERM)
    code = exited(proc, 20)
    said = "\n".join(output.lines)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM axa_worker WHERE pid = %s", [proc.pid])
        registered = cursor.fetchone()[0]
    alive = os.path.exists(f"/proc/{proc.pid}/task")
    threads = sorted(os.listdir(f"/proc/{proc.pid}/task")) if alive else []
    print("exit", code, "registered", registered, "threads left", threads)
    assert code == (0 if concurrency == 2 else 1), (code, registered, threads, said[-2000:])
    assert handlers_ran.read_text() == "ran"  # its exit handlers ran all the same


@pytest.mark.halved
@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_replacement_threads_death_stops_the_worker_once_the_others_job_finished(
    workers,
    log_file,
    fifo,  # noqa: F811 - the fixture imported
):
    # Disproof attempt: the thread started in a stuck one's place dies outside its job (a job_finished receiver's
    # SystemExit, on replacement threads only). Control.fail(): a graceful stop; alive() has the other, live and
    # not stuck, thread, whose job finishes and is not given back; the stuck thread is not joined; exit 1.
    env = workers.env(AXA_TEST_LEASE="10", AXA_TEST_DIE_AFTER_FINISH="replacement")
    proc, output = given_up_once(workers, fifo, env)
    ran = f"{log_file}.ran"
    for _ in range(8):  # the two live threads take jobs in no set order: until the replacement takes one
        long = hostile_jobs.exclusive.perform_later(3.0, log_file)
        wait_for(lambda: len(lines(log_file)) % 2 == 1, what="the long job's start")
        dying = hostile_jobs.finish_then_die.perform_later(ran, 0.2)
        wait_for(
            lambda dying=dying: fresh(dying).status == "completed" or output.has("worker thread axa-job-r1 died"),
            what="the short job run",
        )
        if output.has("worker thread axa-job-r1 died"):
            break
        wait_for(lambda long=long: fresh(long).status == "completed", what="the long job's end")
    else:
        pytest.skip("the replacement thread took no short job")
    code = exited(proc, 30)
    said = "\n".join(output.lines)
    assert code == 1, (code, said[-2000:])
    assert fresh(long).status == "completed" and fresh(dying).status == "completed", said[-2000:]
    assert not any("overlap" in line for line in lines(log_file)) and lines(log_file)[-1] == f"end {proc.pid}"
    assert len(lines(ran)) == 1 and "back to the queue" not in said, (lines(ran), said[-2000:])
