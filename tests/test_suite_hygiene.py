"""A test session leaves nothing behind: no directory, no worker, no server, even on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import ON_ITS_OWN_SERVER, ROOT, wait_for

# The embedded server's lifecycle (its children always start one): tested in the legs that do.
pytestmark = ON_ITS_OWN_SERVER

# The child session's tests: run with tests/conftest.py as a plugin, so they get its fixtures.
CHILD_TESTS = """
import json
import os
from pathlib import Path

from django.conf import settings

from axa_django.models import Job, Worker
from tests.conftest import wait_for


def _report(**extra):
    pgdata = Path(settings.TEST_PGDATA)
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    facts = {"pgdata": str(pgdata), "postmaster": postmaster, **extra}
    Path(os.environ["AXA_HYGIENE_REPORT"]).write_text(json.dumps(facts))


def test_passes(db):
    assert Job.objects.count() == 0
    _report()


def test_waits_for_sigterm(transactional_db, workers):
    proc = workers.start("--concurrency", "1")
    wait_for(Worker.objects.exists, timeout=60, what="the worker to register")
    _report(worker=proc.pid)
    wait_for(lambda: False, timeout=300, what="SIGTERM from the parent session")
"""


def alive(process: psutil.Process) -> bool:
    """True while ``process`` (that very process, not a later one with its pid) runs; a zombie has exited."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pid: int) -> bool:
    """True once ``pid`` has exited."""
    try:
        return not alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def describe(process: psutil.Process) -> str:
    try:
        return f"pid {process.pid} {process.status()}, parent {process.ppid()}, {' '.join(process.cmdline())}"
    except psutil.Error as error:
        return f"pid {process.pid}: {error!r}"


class Child:
    """A pytest session in a subprocess, on its own embedded PostgreSQL, with TMPDIR of its own."""

    def __init__(self, base: Path, tmpdir: Path, test: str) -> None:
        self.tmpdir = tmpdir
        self.report = base / "report.json"
        self.output = base / "output.txt"
        tests = base / "test_child_session.py"
        tests.write_text(CHILD_TESTS)
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env.update(TMPDIR=str(self.tmpdir), AXA_HYGIENE_REPORT=str(self.report), PYTHONUNBUFFERED="1")
        self.facts: dict[str, Any] = {}
        command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q"]
        command += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), f"{tests}::{test}"]
        with self.output.open("w") as out:
            self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def read_facts(self) -> dict[str, Any]:
        def reported() -> bool:
            assert self.proc.poll() is None or self.report.exists(), self.output.read_text()
            return self.report.exists() and self.report.stat().st_size > 0

        wait_for(reported, timeout=120, what="the child session to report")
        self.facts = json.loads(self.report.read_text())
        return self.facts

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child session did not exit within {timeout}s:\n{self.output.read_text()}")

    def leftovers(self) -> list[str]:
        return sorted(path.name for path in self.tmpdir.glob("axa-test-*"))

    def kill_all(self) -> None:
        """Whatever the outcome, stop what the child started (its server survives a killed session)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for key, signum in (("worker", signal.SIGKILL), ("postmaster", signal.SIGQUIT)):
            pid = self.facts.get(key)
            if pid and not gone(pid):
                os.kill(pid, signum)


@pytest.fixture
def fresh_tmpdir() -> Iterator[Path]:
    """An empty TMPDIR for a child session.

    Not under tmp_path: any pytest session that starts (another engineer's, on a shared
    machine) makes /tmp/pytest-of-<user> private again, and the embedded server's own
    system user could no longer reach its data directory there.
    """
    path = Path(tempfile.mkdtemp(prefix="axa-hygiene-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def child(tmp_path: Path, fresh_tmpdir: Path) -> Iterator[Callable[[str], Child]]:
    """Start a child session running one of CHILD_TESTS; stop whatever it left at teardown."""
    started: list[Child] = []

    def start(test: str) -> Child:
        started.append(Child(tmp_path, fresh_tmpdir, test))
        return started[-1]

    yield start
    for session in started:
        session.kill_all()


def test_a_session_leaves_no_directory_and_stops_its_server(child: Callable[[str], Child]) -> None:
    session = child("test_passes")
    code = session.wait()
    facts = session.read_facts()
    assert code == 0, session.output.read_text()
    assert session.leftovers() == []
    wait_for(lambda: gone(facts["postmaster"]), timeout=30, what="the embedded server to stop")


def test_sigterm_to_pytest_stops_its_workers_and_server_and_removes_its_directory(
    child: Callable[[str], Child],
) -> None:
    session = child("test_waits_for_sigterm")
    facts = session.read_facts()
    # Held as processes, not pids: a pid used again by a new process is not the worker.
    worker, postmaster = psutil.Process(facts["worker"]), psutil.Process(facts["postmaster"])
    assert alive(worker) and alive(postmaster)
    session.proc.send_signal(signal.SIGTERM)
    code = session.wait()
    output = session.output.read_text()
    assert code == pytest.ExitCode.INTERRUPTED, output
    for process, what in ((worker, "the worker"), (postmaster, "the embedded server")):
        try:
            wait_for(lambda p=process: not alive(p), timeout=30, what=f"{what} to be gone")
        except AssertionError as error:
            raise AssertionError(f"{error}: {describe(process)}; the session printed:\n{output[-4000:]}") from None
    assert session.leftovers() == []
    assert not Path(facts["pgdata"]).exists()
