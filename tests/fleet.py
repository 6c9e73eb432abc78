"""A PostgreSQL server and worker hosts in network namespaces, for the fleet test (needs root and ``ip``).

Each host is a namespace ``<prefix><i>`` joined to the root namespace by a veth pair:
the root side holds ``10.<net>.<i>.1``, where the dedicated PostgreSQL listens, the
namespace side ``10.<net>.<i>.2``. Cutting a host is ``ip link set <root side> down``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import psycopg

from tests.conftest import ROOT

PG_USER = "postgres"  # PostgreSQL refuses to run as root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


def pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (run the suite as root, or in a privileged container)"
    for tool in ("ip", "runuser", "unshare"):
        if shutil.which(tool) is None:
            return f"no {tool!r} command (apt-get install iproute2 util-linux)"
    if pg_bin() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql (apt-get install postgresql)"
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER!r} system user to run PostgreSQL as"
    probe = f"axp{os.getpid() % 100000}"
    made = _run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe)
    return None


class Fleet:
    """Namespaces, veth pairs and a PostgreSQL listening on each root-side address."""

    def __init__(self, hosts: int) -> None:
        self.tag = os.getpid() % 10000
        self.net = 100 + os.getpid() % 150
        self.hosts = hosts
        self.names = [f"axf{self.tag}n{i}" for i in range(1, hosts + 1)]
        self.links = [f"axf{self.tag}h{i}" for i in range(1, hosts + 1)]
        self.root = Path(tempfile.mkdtemp(prefix="axa-fleet-"))
        self.port = 0
        self.server: subprocess.Popen[str] | None = None
        self.server_log: IO[str] | None = None
        self.procs: list[tuple[subprocess.Popen[str], IO[str]]] = []

    def address(self, host: int) -> str:
        """The server's address as seen from namespace ``host`` (1-based)."""
        return f"10.{self.net}.{host}.1"

    def url(self, host: int = 1, dbname: str = "axa_fleet") -> str:
        return f"postgresql://{PG_USER}@{self.address(host)}:{self.port}/{dbname}"

    def up(self) -> Fleet:
        for i, (ns, link) in enumerate(zip(self.names, self.links, strict=True), start=1):
            peer = link.replace("h", "p")
            for command in (
                ("ip", "netns", "add", ns),
                ("ip", "link", "add", link, "type", "veth", "peer", "name", peer),
                ("ip", "link", "set", peer, "netns", ns),
                ("ip", "addr", "add", f"{self.address(i)}/24", "dev", link),
                ("ip", "link", "set", link, "up"),
                ("ip", "-n", ns, "addr", "add", f"10.{self.net}.{i}.2/24", "dev", peer),
                ("ip", "-n", ns, "link", "set", peer, "up"),
                ("ip", "-n", ns, "link", "set", "lo", "up"),
            ):
                done = _run(*command)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
        self._start_postgres()
        return self

    def _start_postgres(self) -> None:
        bin_dir = pg_bin()
        assert bin_dir is not None
        data = self.root / "pg"
        user = pwd.getpwnam(PG_USER)
        os.chown(self.root, user.pw_uid, user.pw_gid)
        init = _run(
            "runuser", "-u", PG_USER, "--", str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", PG_USER
        )
        assert init.returncode == 0, init.stderr
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all 10.{self.net}.0.0/16 trust\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        listen = ",".join(self.address(i) for i in range(1, self.hosts + 1))
        self.server_log = (self.root / "pg.log").open("w")
        self.server = subprocess.Popen(
            ["runuser", "-u", PG_USER, "--", str(bin_dir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-c", f"listen_addresses={listen}", "-c", f"unix_socket_directories={self.root}",
             "-c", "max_connections=200", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off", "-c", "shared_buffers=64MB",
             # A transaction whose COMMIT was lost with the link would hold its row locks until
             # the server noticed the dead peer (hours): end it instead (docs/operations.md).
             "-c", "idle_in_transaction_session_timeout=2000"],
            stdout=subprocess.DEVNULL, stderr=self.server_log, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url(1, "postgres"), autocommit=True, connect_timeout=2) as conn:
                    conn.execute("CREATE DATABASE axa_fleet")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.server.poll() is not None:
                    raise RuntimeError(
                        "the fleet's PostgreSQL did not start: " + (self.root / "pg.log").read_text()
                    ) from None
                time.sleep(0.1)

    def env(self, host: int, **extra: str) -> dict[str, str]:
        env = dict(os.environ, DATABASE_URL=self.url(host), DJANGO_SETTINGS_MODULE="tests.settings")
        env.update(PYTHONUNBUFFERED="1", **extra)
        return env

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=ROOT,
            env=self.env(1),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def start_worker(self, host: int, *args: str, **env: str) -> subprocess.Popen[str]:
        """``runworker`` in namespace ``host`` (1-based), its hostname ``fleet-<host>``, output to a file."""
        log = (self.root / f"worker{host}.log").open("w")
        script = f'hostname fleet-{host} && exec "$@"'
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.names[host - 1], "unshare", "--uts", "sh", "-c", script, "sh",
             sys.executable, "-m", "django", "runworker", *args],
            cwd=ROOT, env=self.env(host, **env), stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.procs.append((proc, log))
        return proc

    def log(self, host: int) -> str:
        return (self.root / f"worker{host}.log").read_text()

    def cut(self, host: int) -> None:
        assert _run("ip", "link", "set", self.links[host - 1], "down").returncode == 0

    def mend(self, host: int) -> None:
        assert _run("ip", "link", "set", self.links[host - 1], "up").returncode == 0

    def down(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            log.close()
        if self.server is not None and self.server.poll() is None:
            # runuser does not pass SIGQUIT on: signal the postmaster itself (immediate shutdown).
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int((self.root / "pg" / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=30)
        if self.server_log is not None:
            self.server_log.close()
        for ns in self.names:
            _run("ip", "netns", "del", ns)  # removes the veth pair with it
        for link in self.links:
            _run("ip", "link", "del", link)
        shutil.rmtree(self.root, ignore_errors=True)

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(1), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []
