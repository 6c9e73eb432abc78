"""A real PgBouncer (Debian's /usr/sbin/pgbouncer) in front of the test database server."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

BINARY = os.environ.get("AXA_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")
POOL_SIZE = 8


class PgBouncerError(RuntimeError):
    """PgBouncer did not start or does not answer."""


def available() -> str | None:
    """Why the rig cannot run here, or None if it can."""
    if not os.access(BINARY, os.X_OK):
        return f"no PgBouncer binary at {BINARY} (apt-get install pgbouncer; .ci/run installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as(host: str) -> str | None:
    """The system user PgBouncer drops to when we are root (it refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        # The server's socket directory may be private to its owner (initdb makes it 0700).
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise PgBouncerError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PgBouncer as")


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """One PgBouncer process on 127.0.0.1:<free port>, pooling to the server in ``settings``.

    ``settings`` is a Django DATABASES entry (``connection.settings_dict``); clients log
    in with its USER and PASSWORD and reach any database name on that server.
    """

    def __init__(
        self,
        settings: dict[str, Any],
        mode: str = "transaction",
        pool_size: int = POOL_SIZE,
        round_robin: bool = False,
    ) -> None:
        if mode not in ("transaction", "session"):
            raise ValueError(f"pool mode must be 'transaction' or 'session', not {mode!r}")
        self.mode = mode
        self.pool_size = pool_size
        # Idle server connections are handed out first in, first out instead of last in, first
        # out: sequential transactions then take the pool's servers in turn, as a busy pool would.
        self.round_robin = round_robin
        self.host = settings["HOST"] or "/var/run/postgresql"
        self.server_port = int(settings["PORT"] or 5432)
        self.user = settings["USER"] or "postgres"
        self.password = settings["PASSWORD"] or ""
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="axa-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "pgbouncer.log"

    def url(self, dbname: str) -> str:
        """A DATABASE_URL that reaches ``dbname`` through this bouncer."""
        auth = quote(self.user, safe="") + (":" + quote(self.password, safe="") if self.password else "")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def connect(self, dbname: str, **kwargs: Any) -> psycopg.Connection[Any]:
        """A psycopg connection through the bouncer (no prepared statements: the pool may move it)."""
        kwargs.setdefault("prepare_threshold", None)
        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(self.url(dbname), **kwargs)

    def open_servers(self, dbname: str, count: int) -> None:
        """Have the pool open ``count`` server connections to ``dbname`` (a client in a transaction holds one each)."""
        with contextlib.ExitStack() as stack:
            # Each leaves with a commit: a client closed inside its transaction has its server closed too.
            clients = [stack.enter_context(self.connect(dbname)) for _ in range(count)]
            for conn in clients:
                conn.execute("SELECT 1")

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run one command on the admin console (``SHOW POOLS``); it speaks only the simple protocol."""
        with self.connect("pgbouncer", autocommit=True) as conn:
            result = conn.pgconn.exec_(command.encode())
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise PgBouncerError(f"{command}: {(result.error_message or b'').decode(errors='replace')}")
            return [
                tuple(
                    None if (v := result.get_value(row, col)) is None else v.decode() for col in range(result.nfields)
                )
                for row in range(result.ntuples)
            ]

    def _write_config(self, port: int, user: str | None) -> Path:
        auth_type = "scram-sha-256" if self.password else "trust"
        # The plain password lets PgBouncer check clients by SCRAM and log in to the server with it.
        (self.dir / "users.txt").write_text(f"{_quote(self.user)} {_quote(self.password)}\n")
        server = f"host={self.host} port={self.server_port} user={self.user}"
        if self.password:
            server += f" password={self.password}"
        config = self.dir / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = {server}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    f"auth_type = {auth_type}",
                    f"auth_file = {self.dir / 'users.txt'}",
                    f"admin_users = {self.user}",
                    f"pool_mode = {self.mode}",
                    f"default_pool_size = {self.pool_size}",
                    f"server_round_robin = {int(self.round_robin)}",
                    "max_client_conn = 500",
                    # Session state a client leaves is wiped only when it disconnects, and only in session mode.
                    "server_reset_query = DISCARD ALL",
                    "ignore_startup_parameters = extra_float_digits,options",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (self.dir, config, self.dir / "users.txt"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(self.dir, 0o700)
        os.chmod(self.dir / "users.txt", 0o600)
        return config

    def start(self, timeout: float = 20.0) -> PgBouncer:
        """Start PgBouncer and wait until it serves a query on the server's ``postgres`` database."""
        reason = available()
        if reason:
            raise PgBouncerError(reason)
        user = _run_as(self.host)
        for _ in range(5):  # another process may take the free port before PgBouncer binds it
            self.port = _free_port()
            config = self._write_config(self.port, user)
            command = [BINARY, *(["-u", user] if user else []), str(config)]
            with self.log.open("ab") as log:  # in the foreground PgBouncer logs to stderr
                self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            error = self._wait_ready(timeout)
            if error is None:
                return self
            self.stop(remove=False)
            if "Address already in use" not in error:
                break
        raise PgBouncerError(f"PgBouncer did not start: {error}")

    def _wait_ready(self, timeout: float) -> str | None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"exited with {self.proc.returncode}: {self.log.read_text(errors='replace').strip()}"
            try:
                with self.connect("postgres", autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return None
            except psycopg.OperationalError as error:
                last = str(error)
            time.sleep(0.05)
        return f"no answer within {timeout}s ({last}); log: {self.log.read_text(errors='replace').strip()}"

    def stop(self, remove: bool = True) -> None:
        """Stop PgBouncer (closing every client and server connection) and delete its files."""
        if self.proc is not None:
            if self.proc.poll() is None:
                # SIGTERM shuts down at once; SIGINT would wait for session-mode clients to leave.
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """Wait for a worker to exit; return its exit code and output."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"worker did not exit within {timeout}s; its output:\n{output}")
    return proc.returncode, output
