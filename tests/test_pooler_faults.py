"""The start-up pooler check (startup.check_pooler / pooled) under faults: backends ended, restarts, busy pools.

Real PostgreSQL, real PgBouncer, real runworker subprocesses; faults are real
(pg_terminate_backend from another session, a server restart).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, connections

from axa_django import Job
from axa_django.exceptions import PoolerMisconfigured
from axa_django.worker import Worker
from axa_django.worker.startup import check_pooler
from tests.conftest import AXA_APPS, Workers, restart_postgres, started_its_own_server, wait_for
from tests.pgbouncer import PgBouncer, finish
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

Start = Callable[..., PgBouncer]
CHECK_READ = "SELECT pg_backend_pid()"


def direct_params() -> dict[str, Any]:
    s = connection.settings_dict
    return {
        "dbname": s["NAME"],
        "user": s["USER"],
        "password": s["PASSWORD"],
        "host": s["HOST"],
        "port": s["PORT"] or None,
        "autocommit": True,
        "connect_timeout": 10,
    }


class Killer:
    """A thread that terminates, from its own direct session, each backend of ``targets``
    (application names) once it has run one of the check's reads."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        self.targets = list(targets)
        self.killed: set[int] = set()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with psycopg.connect(**direct_params()) as admin:
                while not self.stop.is_set():
                    rows = admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name = ANY(%s) AND query = %s",
                        [self.targets, CHECK_READ],
                    ).fetchall()
                    for (pid,) in rows:
                        if pid not in self.killed:
                            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
                            self.killed.add(pid)
                    self.stop.wait(0.003)  # the poll's period: the condition is the rows above
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.errors.append(error)

    def __enter__(self) -> Killer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def run_checks(rounds: int, killer: Killer, kills: int) -> tuple[Worker, list[str]]:
    """Run the real check on one worker's dispatcher (prepared statements on) ``rounds`` times
    and until ``killer`` has ended ``kills`` backends (within a deadline)."""
    worker = Worker(concurrency=1, install_signals=False)
    db = worker.db
    assert db.open_first()
    refusals: list[str] = []
    try:
        with killer:
            deadline = time.monotonic() + 90
            done = 0
            while done < rounds or len(killer.killed) < kills:
                assert time.monotonic() < deadline, f"{len(killer.killed)} backends ended in {done} checks"
                done += 1
                try:
                    check_pooler(db, worker.options, worker.listener)
                except PoolerMisconfigured as error:
                    refusals.append(str(error))
                    assert db.open_first()
                if not worker.listener.enabled:
                    refusals.append("fell back to polling")
                    worker.listener.enabled = True
        assert not killer.errors, killer.errors
        return worker, refusals
    finally:
        db.close()


@pytest.mark.halved
@pytest.mark.parametrize(
    "targets",
    [("axa_django dispatcher",), ("axa_django probe",), ("axa_django dispatcher", "axa_django probe")],
    ids=["dispatcher", "probe", "both"],
)
def test_backends_terminated_during_the_check_on_a_direct_connection_are_no_pooler(targets: tuple[str, ...]) -> None:
    # (a) The dispatcher reconnecting mid-check (its new backend may take a freed pid), the
    # probe's backend ending between its reads: never a transaction pooler.
    killer = Killer(targets)
    worker, refusals = run_checks(15, killer, kills=3)
    assert refusals == []
    if "axa_django dispatcher" in targets:
        assert worker.db.opened > 5


@contextlib.contextmanager
def through(bouncer: PgBouncer) -> Iterator[None]:
    """Point the default alias's new connections (the worker's) at ``bouncer``."""
    settings = connections["default"].settings_dict
    saved = {key: settings[key] for key in ("HOST", "PORT")}
    settings.update(HOST="127.0.0.1", PORT=str(bouncer.port))
    try:
        yield
    finally:
        settings.update(saved)


@pytest.mark.halved
@pytest.mark.parametrize("round_robin", [False, True], ids=["lifo", "round_robin"])
def test_server_backends_terminated_during_the_check_behind_a_session_pool_are_no_pooler(
    pgbouncer: Start, round_robin: bool
) -> None:
    # (a) A session pool whose server connection under the dispatcher ends: PgBouncer must not
    # hand the same client another backend (which the check would take for a transaction pool).
    bouncer = pgbouncer("session", pool_size=12, round_robin=round_robin)
    killer = Killer(("axa_django dispatcher", "axa_django probe"))
    with through(bouncer):
        worker, refusals = run_checks(15, killer, kills=3)
    assert refusals == []
    assert worker.db.opened > 1  # PgBouncer closed the client whose server ended: it reconnected


@pytest.mark.skipif(not started_its_own_server(), reason="restarts the embedded server (no DATABASE_URL)")
def test_a_server_restart_during_the_check_is_no_pooler() -> None:
    # (a) The server restarting while the check runs: both connections end, the dispatcher
    # reconnects to a fresh server whose pids start over.
    worker = Worker(concurrency=1, install_signals=False)
    db = worker.db
    assert db.open_first()
    stop = threading.Event()
    outcomes: list[str] = []
    ran = [0]

    def loop() -> None:
        while not stop.is_set():
            try:
                check_pooler(db, worker.options, worker.listener)
                outcomes.append("ok" if worker.listener.enabled else "polls")
            except PoolerMisconfigured as error:
                outcomes.append(str(error))
                db.close()
            except BaseException as error:  # noqa: BLE001 - reported by the test
                outcomes.append(f"{type(error).__name__}: {error}")
            ran[0] += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        for _ in range(3):
            start = ran[0]
            wait_for(lambda start=start: ran[0] > start + 3, timeout=60, what="checks before the restart")
            restart_postgres()
        start = ran[0]
        wait_for(lambda: ran[0] > start + 3, timeout=60, what="checks after the restarts")
    finally:
        stop.set()
        thread.join(timeout=60)
        db.close()
    assert db.opened >= 4
    assert set(outcomes) == {"ok"}, [o for o in outcomes if o != "ok"]


@pytest.mark.halved
def test_a_busy_round_robin_session_pool_runs_a_worker_with_the_defaults(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    # (a) server_round_robin in session mode, other clients coming and going: each client keeps
    # its server for its session, so the worker must start with prepared statements and NOTIFY.
    bouncer = pgbouncer("session", pool_size=16, round_robin=True)
    name = connection.settings_dict["NAME"]
    stop = threading.Event()
    churned = [0]

    def churn() -> None:
        while not stop.is_set():
            with bouncer.connect(name, autocommit=True) as conn:
                conn.execute("SELECT pg_backend_pid()")
            churned[0] += 1

    churners = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for thread in churners:
        thread.start()
    try:
        jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(40)])
        env = workers.env(DATABASE_URL=bouncer.url(name))
        procs = [workers.start("--burst", "--concurrency", "2", env=env) for _ in range(2)]
        outputs = [finish(proc) for proc in procs]
    finally:
        stop.set()
        for thread in churners:
            thread.join(timeout=30)
    assert churned[0] > 0
    for code, output in outputs:
        assert code == 0, output
        assert "pooler" not in output, output
    assert Job.objects.filter(status="completed").count() == 40
    assert sorted(Path(log_file).read_text().split()) == sorted(f"t{i}" for i in range(40))


def test_a_round_robin_transaction_pool_with_prepare_threshold_0_refuses_with_the_pooler_message(
    pgbouncer: Start, workers: Workers, log_file: str
) -> None:
    # prepare_threshold 0 (every statement prepared at its first run) behind a pool that hands
    # each transaction to the next server: the worker must still refuse, exit 2, naming PgBouncer.
    bouncer = pgbouncer("transaction", pool_size=3, round_robin=True)
    name = connection.settings_dict["NAME"]
    bouncer.open_servers(name, 3)
    jobs.record.perform_later_many([{"token": f"t{i}", "log": log_file} for i in range(10)])
    env = workers.env(DATABASE_URL=bouncer.url(name), DJANGO_SETTINGS_MODULE="tests.threshold0_settings")
    code, output = finish(workers.start("--burst", "--concurrency", "2", env=env))
    assert Job.objects.filter(status="queued", attempts=0).count() == 10
    assert code == 2, output
    assert "PgBouncer" in output and "TRANSACTION_POOLING" in output, output


def test_a_round_robin_transaction_pool_refusing_the_probe_still_refuses_a_worker_with_prepared_statements(
    pgbouncer: Start,
) -> None:
    # (b) The probe cannot connect (PgBouncer refusing new clients: max_client_conn reached, a
    # database DISABLEd) while the dispatcher is in: the check gives up before reading anything,
    # though the dispatcher's own backend moving from read to read gives this pool away alone.
    bouncer = pgbouncer("transaction", pool_size=3, round_robin=True)
    name = connection.settings_dict["NAME"]
    bouncer.open_servers(name, 3)
    with through(bouncer):
        worker = Worker(concurrency=1, install_signals=False)
        db = worker.db
        assert db.open_first()
        try:
            with bouncer.connect("pgbouncer", autocommit=True) as console:
                result = console.pgconn.exec_(f"DISABLE {name}".encode())  # the console speaks only simple queries
                assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message
            with pytest.raises(psycopg.OperationalError):
                bouncer.connect(name).close()
            pids = {db.execute(CHECK_READ, {}, prepare=False)[0][0] for _ in range(3)}  # type: ignore[index]
            assert len(pids) > 1, pids  # what the check could have seen on the dispatcher alone
            with pytest.raises(PoolerMisconfigured):
                check_pooler(db, worker.options, worker.listener)
        finally:
            db.close()
