"""Jobs that behave as no job should: what the worker must survive (tests/test_hardening.py)."""

import asyncio
import atexit
import ctypes
import os
import sys
import threading
import time

from django.db import connection, transaction
from django.dispatch import receiver

from axa_django import background_job
from axa_django.signals import job_enqueued, job_finished
from tests.tasks_api import task


class Custom(BaseException):
    """A BaseException that is none of Python's own."""


_KINDS = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "GeneratorExit": GeneratorExit,
    "SystemExit": SystemExit,
    "Custom": Custom,
}


def _mark(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


@background_job(max_attempts=2, backoff=0)
def raise_base(kind: str, log: str) -> None:
    _mark(log, kind)
    raise _KINDS[kind]("raised by the job")


@background_job(max_attempts=2, backoff=0)
async def async_raise_base(kind: str, log: str) -> None:
    _mark(log, kind)
    await asyncio.sleep(0)
    raise _KINDS[kind]("raised by the async job")


@background_job
def return_nul() -> str:
    return "before\x00after"


@background_job
def raise_nul() -> None:
    raise ValueError("bad \x00 byte and a lone \ud800 surrogate")


@background_job
def leak_transaction(how: str, marker: str) -> str:
    """Write a marker row in axa_schedule, then return with the transaction left open."""
    if how == "atomic":
        transaction.atomic().__enter__()
    elif how == "autocommit":
        transaction.set_autocommit(False)
    with connection.cursor() as cursor:
        if how == "begin":
            cursor.execute("BEGIN")
        cursor.execute("INSERT INTO axa_schedule (name, last_run) VALUES (%s, now())", [marker])
    return how


@background_job
def write_marker(marker: str) -> str:
    """Write a marker row in axa_schedule and commit (autocommit)."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO axa_schedule (name, last_run) VALUES (%s, now())", [marker])
    return marker


@background_job
def kill_worker(log: str) -> None:
    """End the whole worker process at once, as the OOM killer would."""
    _mark(log, str(os.getpid()))
    os._exit(9)


class ThreadKilled(BaseException):
    """Injected into one of the worker's own threads."""


@background_job
def kill_thread(name: str) -> str:
    """Raise ThreadKilled inside the worker thread called ``name`` (MainThread: the dispatcher)."""
    target = next(t for t in threading.enumerate() if t.name == name)
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target.ident), ctypes.py_object(ThreadKilled))
    return f"{name}: {hit}"


@background_job
def exclusive(seconds: float, log: str) -> None:
    """Run ``seconds`` holding a session advisory lock; a run that starts while another holds it logs "overlap".

    The lock goes with the run's end, or with its process (PostgreSQL drops a gone client's
    locks): "overlap" means the first run was still inside this code in a live process.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext('hostile_jobs.exclusive'))")
        alone = cursor.fetchone()[0]
        _mark(log, f"start {os.getpid()} {'alone' if alone else 'overlap'}")
        time.sleep(seconds)
        _mark(log, f"end {os.getpid()}")
        if alone:
            cursor.execute("SELECT pg_advisory_unlock(hashtext('hostile_jobs.exclusive'))")


def _local(name: str, type_name: str):
    """The object bound to ``name`` in a frame of this thread's stack whose type is ``type_name``."""
    frame = sys._getframe()
    while frame is not None:
        value = frame.f_locals.get(name)
        if value is not None and type(value).__name__ == type_name:
            return value
        frame = frame.f_back
    raise LookupError(f"no {type_name} named {name!r} on this thread's stack")


@background_job
def break_hand_out() -> str:
    """The dispatcher's next non-empty ``ledger.hand_out`` raises ThreadKilled before it puts any job on the threads'
    queue: what ``kill_thread("MainThread")`` does when its exception lands between the claim's ``ledger.hold`` (in
    ``Claimer._build``) and the end of ``hand_out``. Once; the jobs it was given stay held by the ledger."""
    ledger = _local("ledger", "Ledger")  # JobThreads.loop's, the worker's one ledger

    def hand_out(jobs):
        jobs = list(jobs)
        if not jobs:
            return type(ledger).hand_out(ledger, jobs)
        del ledger.hand_out  # once
        raise ThreadKilled(f"injected between the claim's hold and its hand-out: {len(jobs)} job(s) held")

    ledger.hand_out = hand_out
    return "armed"


@background_job
def kill_an_idle_job_thread() -> str:
    """Raise ThreadKilled in a job thread other than this one that waits for work (its top frame JobThreads.loop).

    It is raised there as that thread takes its next job, in the worker's code around the job: the
    thread dies, as one does on any exception outside ``perform`` (``control.spawn``: ``die``)."""
    me = threading.get_ident()
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread.ident == me or not thread.name.startswith("axa-job-"):
            continue
        frame = frames.get(thread.ident)
        if (
            frame is not None
            and frame.f_code.co_name == "loop"
            and frame.f_code.co_filename.endswith(os.path.join("worker", "jobs.py"))
        ):
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(ThreadKilled))
            return thread.name
    raise LookupError("no idle job thread")


# Names that look like SQL or format strings stay data in the worker's statements.
for _name in ("%(queues)s", "{names}", "';DROP/**/TABLE/**/axa_queue;--", "%s%%%(limit)s"):
    background_job(name=_name)(lambda: "ran")


if os.environ.get("AXA_TEST_SLOW_HOUSEKEEPING"):
    _slowed = threading.Event()

    @background_job(name="tests.slow_housekeeping", cron="* * * * * *")
    def slow_housekeeping() -> str:
        return "tick"

    @receiver(job_enqueued)
    def _stall(sender, job, **kwargs) -> None:
        """The first periodic enqueue holds the dispatcher for 3 leases, as a slow receiver would."""
        if job.name == "tests.slow_housekeeping" and not _slowed.is_set():
            _slowed.set()
            time.sleep(3 * float(os.environ.get("AXA_TEST_LEASE", "3")) + 1)


@task
def task_raise_base(kind: str) -> None:
    raise _KINDS[kind]("raised by the task")


# -- tests/test_worker_death_held.py -------------------------------------------------------


@background_job
def write_stuck_idents(path: str) -> str:
    """Write the idents of the job threads the worker's ledger counts stuck (given up at their timeout, alive)."""
    ledger = _local("ledger", "Ledger")
    with open(path, "w") as f:
        f.write(" ".join(str(thread.ident) for thread in ledger.stuck_threads()))
    return "written"


@background_job(takes_context=True)
def probe_stuck_ident(context, log: str, idents: str, marked_seconds: float, other_seconds: float) -> str:
    """Run ``marked_seconds`` on a job thread whose ident a thread given up had (``idents``: a file of
    ``write_stuck_idents``), else ``other_seconds``.

    Logs "start <pid> <thread> reused=<bool> alone|overlap <job id>" (an advisory lock per job id: "overlap" means
    another run of this very job was still inside this code in a live process) and "end <pid> <thread> <job id>"."""
    with open(idents) as f:
        marked = str(threading.get_ident()) in f.read().split()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [str(context.job_id)])
        alone = cursor.fetchone()[0]
        _mark(
            log,
            f"start {os.getpid()} {threading.current_thread().name} reused={marked} "
            f"{'alone' if alone else 'overlap'} {context.job_id}",
        )
        time.sleep(marked_seconds if marked else other_seconds)
        _mark(log, f"end {os.getpid()} {threading.current_thread().name} {context.job_id}")
        if alone:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [str(context.job_id)])
    return threading.current_thread().name


@background_job
def finish_then_die(log: str, seconds: float) -> str:
    """Run ``seconds``, then log "ran <pid>"; a job_finished receiver (below) then raises SystemExit in the job
    thread, after the outcome was handed to the finisher: the thread dies outside its job."""
    time.sleep(seconds)
    _mark(log, f"ran {os.getpid()}")
    return "done"


_DIE_AFTER = "tests.testapp.hostile_jobs.finish_then_die"


def _die_after_finish(sender, name=None, **kwargs) -> None:
    if (
        name == _DIE_AFTER
        and threading.current_thread().name.startswith(
            "axa-job-r" if os.environ.get("AXA_TEST_DIE_AFTER_FINISH") == "replacement" else "axa-job-"
        )
        and os.environ.get("AXA_TEST_DIE_AFTER_FINISH")
    ):
        raise SystemExit("a job_finished receiver ended its thread (test)")


job_finished.connect(_die_after_finish, dispatch_uid="review_held_die_after_finish")


# -- tests/test_worker_death_held.py: the third review ---------------------------------------

if os.environ.get("AXA_TEST_GIVE_UP_RACE"):
    import logging

    _returned = threading.Event()
    _returned_ident: list[int] = []

    class _GiveUpRace(logging.Filter):
        """Hold the watchdog between ``watch.abandon()`` and ``ledger.stuck()`` (at failure()'s log line, as a
        blocked stderr or a descheduled thread would) while the given-up thread returns and exits."""

        def filter(self, record: logging.LogRecord) -> bool:
            text = str(record.msg)
            if "returned after it was given up" in text:
                _returned_ident.append(record.thread)
                _returned.set()
            elif (
                record.threadName == "axa-watchdog"
                and text.startswith("job %s %s failed")
                and record.args
                and record.args[0] == "tests.testapp.flow_jobs.blocked"
                and not _returned.is_set()
            ):
                try:
                    with open(os.environ["AXA_TEST_GIVE_UP_RACE"], "w") as writer:
                        writer.write("late")  # the given-up thread's C call ends now
                except BrokenPipeError:
                    pass  # the reader stopped at once: its JobTimeout was waiting
                _returned.wait(5)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and any(t.ident in _returned_ident for t in threading.enumerate()):
                    time.sleep(0.01)
            return True

    logging.getLogger("axa_django").addFilter(_GiveUpRace())


# -- tests/test_worker_death_held.py: the fourth review ---------------------------------------


@background_job(timeout=0.5)
async def async_blocked(path: str) -> str:
    """An async job that blocks its event loop in C (a FIFO's open waits for a writer): no cancel reaches it."""
    with open(path) as fifo:  # blocks the loop: the fault itself
        return fifo.read()


@background_job
def write_stuck_names(path: str) -> str:
    """Write the names of the threads the worker's ledger counts stuck (given up at their timeout, alive)."""
    ledger = _local("ledger", "Ledger")
    with open(path, "w") as f:
        f.write(" ".join(thread.name for thread in ledger.stuck_threads()))
    return "written"


if os.environ.get("AXA_TEST_SLOW_STUCK"):
    from axa_django.worker.ledger import Ledger

    _stuck = Ledger.stuck

    def _slow_stuck(self, thread):
        """Hold the watchdog between ``ledger.release()`` and ``ledger.stuck()`` (as a descheduled thread would):
        the given-up job is no longer held, its thread not yet counted stuck."""
        time.sleep(float(os.environ["AXA_TEST_SLOW_STUCK"]))
        return _stuck(self, thread)

    Ledger.stuck = _slow_stuck


if os.environ.get("AXA_TEST_ATEXIT_FILE"):
    # The worker's exit handlers (an error reporter's flush) run even when it leaves by os._exit.
    atexit.register(lambda: open(os.environ["AXA_TEST_ATEXIT_FILE"], "w").write("ran"))  # noqa: SIM115


if os.environ.get("AXA_TEST_SLOW_MAINTENANCE"):
    # The maintenance thread's first round hangs (as a statement on a frozen network would), once it has
    # touched AXA_TEST_MAINTENANCE_FLAG: a stop joining it must still end at its grace period.
    from axa_django import housekeeping as _housekeeping

    _round = _housekeeping.run

    def _slow_round(worker, prune_until=None):
        if threading.current_thread().name == "axa-maintenance":
            open(os.environ["AXA_TEST_MAINTENANCE_FLAG"], "w").close()
            time.sleep(float(os.environ["AXA_TEST_SLOW_MAINTENANCE"]))
        return _round(worker, prune_until)

    _housekeeping.run = _slow_round
