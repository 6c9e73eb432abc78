"""A stop during a database outage that does not end keeps its grace period.

The worker's connections go through a TCP proxy the test cuts (the test's own stays
direct): the job's outcome can never be written. The stop must still end the worker
within the grace period (exit 1), leaving the row running under it for the rescue.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from axa_django import Job, background_job
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

GRACE = 1.0
# What a stop may take past its grace period: the timer, a wait on a job thread (0.5 s)
# and the finisher's and listener's joins, which all give up at once on the abort.
BOUND = 3.0

go = threading.Event()


def stop_outage_waits(query: bool) -> None:
    go.wait(30)
    if query:  # dies with the cut connection: lost to the database, its thread awaits the write
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")


class Proxy:
    """Forwards TCP to PostgreSQL until ``cut``, which drops every connection and refuses new ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.up = True
        self.threads: list[tuple[Worker, threading.Thread]] = []  # the workers started through it
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            if not self.up:  # closing the socket does not end an accept() under way
                client.close()
                return
            host, port = self.target
            if host.startswith("/"):  # the embedded server listens on a Unix socket
                server = socket.socket(socket.AF_UNIX)
                server.connect(f"{host}/.s.PGSQL.{port}")
            else:
                server = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up = False
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way (Linux)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    connection.ensure_connection()  # the test's own connection: direct, opened before the switch
    settings = connections.settings["default"]
    saved = settings["HOST"], settings["PORT"]
    proxy = Proxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    settings["HOST"], settings["PORT"] = "127.0.0.1", str(proxy.port)
    go.clear()
    try:
        yield proxy
    finally:
        go.set()
        proxy.cut()
        for worker, _ in proxy.threads:
            worker.abort()  # one the stop did not end (a regression) must not outlive the test
        settings["HOST"], settings["PORT"] = saved  # and then it can reach the database again
        for _, thread in proxy.threads:
            thread.join(30)


@pytest.mark.parametrize(
    ("concurrency", "query"),
    [
        # A lost job's thread waits for its outcome's write: the dispatcher's reconnect
        # waited for it (jobs held), the grace period not yet started.
        (2, True),
        # A job that ended: nothing held, its outcome unwritten, which the stop waited for.
        (1, False),
    ],
    ids=["lost-job-held", "outcome-unwritten"],
)
def test_a_stop_during_an_endless_outage_ends_within_the_grace_period(proxy, caplog, concurrency, query):
    # A name registered now: only this worker knows it (a worker of another test of this
    # process, started before, claims by the names it knew then), so only it runs the job.
    waits = background_job(name=f"tests.stop_outage.waits_{uuid.uuid4().hex}")(stop_outage_waits)
    worker = Worker(install_signals=False, concurrency=concurrency, grace_period=GRACE, poll_interval=0.2)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(worker.run()), name="outage worker", daemon=True)
    proxy.threads.append((worker, thread))
    thread.start()
    job = waits.perform_later(query=query)
    wait_for(
        lambda: Job.objects.filter(pk=job.pk, status="running", worker_id=worker.id).exists(),
        20,
        what="the job running under this worker",
    )

    proxy.cut()  # the outage: it never ends
    go.set()
    wait_for(lambda: worker.ledger.unwritten() == 1, 20, what="the job's outcome waiting to be written")
    assert worker.ledger.held() == (1 if query else 0)  # a lost job's thread waits for the write
    if query:  # the dispatcher in its reconnect, which waited for the jobs held
        wait_for(lambda: "dispatcher: cannot reach the database" in caplog.text, 20, what="the dispatcher reconnecting")

    stopped = time.monotonic()
    worker.stop()  # SIGTERM
    wait_for(lambda: not thread.is_alive(), GRACE + BOUND + 5, what="the worker gone after its grace period")
    took = time.monotonic() - stopped

    assert GRACE <= took < GRACE + BOUND, took
    assert codes == [1]  # the grace period ran out: exit 1, as documented
    assert worker.control.aborting.is_set()
    # Nothing it could not write is lost: the row stays running under the dead worker
    # (still registered, its heartbeat stopped) until the rescue queues it again.
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.worker_id) == ("running", worker.id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM axa_worker WHERE id = %s", [worker.id])
        assert cursor.fetchone() == (1,)
    if query:  # the lost job's thread says so, not that the job was queued again
        wait_for(lambda: "could not be written before the stop" in caplog.text, 10, what="the lost job's line")
        assert "queued again without using an attempt" not in caplog.text
