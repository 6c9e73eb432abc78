"""A race harness: connections driven step by step from a test, each in a thread of its own.

An ``Actor`` owns two connections to the test database, made in its own thread: Django's
(for the ORM, the admin's model methods, retention) and a worker's psycopg connection
(``axa_django.worker.connect``, for the worker's statements and the seed's, run as a
worker or a Rust service runs them). A test opens a transaction on one actor, runs a
statement there (its row locks held, nothing committed), starts a statement on a second
actor and shows it waiting on a lock (``pg_stat_activity``, within a deadline), or
completing, then commits or rolls the first back and reads what each saw and left.

Nothing here mocks the database or sleeps to wait: every wait polls with a deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import psycopg
from django.db import connection, connections, transaction

from axa_django import Job, sql
from axa_django.execution import Claimed, Outcome, failure
from axa_django.registry import JobFunction
from axa_django.worker import connect
from tests.conftest import wait_for
from tests.test_seed_sql import CLAIM as SEED_CLAIM
from tests.test_seed_sql import ENQUEUE as SEED_ENQUEUE

# How long any one step may take before the test fails (a statement that should wait
# and then finish, a thread's answer): generous, for a loaded two-core machine.
DEADLINE = 20.0


class Actor:
    """A thread holding its own connections, running the callables it is given, one at a time, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pids: list[int] = []
        self._inbox: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]] | None] = queue.Queue()
        self._worker_conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._serve, name=f"race {name}", daemon=True)
        self._thread.start()

    # From the test's thread.

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._inbox.put((fn, args, future))
        return future

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = DEADLINE) -> Any:
        return self.submit(fn, *args).result(timeout=timeout)

    def ready(self) -> None:
        """Open (or reopen) both connections, out of any transaction; note their backends' pids."""
        self.pids = self.call(self._ready)

    def begin(self) -> None:
        """Open a transaction on both connections: what runs next holds its locks until ``end``."""
        self.call(self._begin)

    def end(self, commit: bool) -> None:
        self.call(self._end, commit)

    def waiting(self) -> bool:
        """Whether one of this actor's backends waits on a lock now (read from the test's own connection)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event_type = 'Lock'", [self.pids]
            )
            return bool(cursor.fetchone()[0])

    def cancel_statement(self) -> None:
        """Last resort of a failing test: end whatever statement this actor still runs."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_cancel_backend(pid) FROM unnest(%s::int[]) AS p(pid)", [self.pids])

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=DEADLINE)

    # In the actor's thread.

    @property
    def worker_conn(self) -> psycopg.Connection[Any]:
        assert threading.current_thread() is self._thread, "a worker connection is used in its actor's thread"
        if self._worker_conn is None or self._worker_conn.closed:
            self._worker_conn = connect("default", f"race {self.name}")
        return self._worker_conn

    def _serve(self) -> None:
        try:
            while True:
                item = self._inbox.get()
                if item is None:
                    return
                fn, args, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args))
                except BaseException as error:  # noqa: BLE001 - handed to the test, which judges it
                    future.set_exception(error)
        finally:
            if self._worker_conn is not None:
                self._worker_conn.close()
            connections.close_all()

    def _ready(self) -> list[int]:
        if not connection.get_autocommit():
            connection.rollback()
            transaction.set_autocommit(True)
        conn = self.worker_conn
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        connection.ensure_connection()
        return [connection.connection.info.backend_pid, conn.info.backend_pid]

    def _begin(self) -> None:
        transaction.set_autocommit(False)
        self.worker_conn.execute("BEGIN")

    def _end(self, commit: bool) -> None:
        conn = self.worker_conn
        try:
            conn.execute("COMMIT" if commit else "ROLLBACK")
        finally:
            try:
                if commit:
                    connection.commit()
                else:
                    connection.rollback()
            finally:
                transaction.set_autocommit(True)


@dataclasses.dataclass
class Subject:
    """The job a race is about, and what its statements need to name it."""

    id: uuid.UUID
    name: str
    worker: uuid.UUID | None = None
    claimed: Claimed | None = None
    function: JobFunction[Any, Any] | None = None
    # The job as each actor's user read it before the race (a view, a form, the admin's page), by actor name.
    loaded: dict[str, Job] = dataclasses.field(default_factory=dict)
    others: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Move:
    """A statement (or a library call) that one actor runs on the subject's row.

    ``via`` names the connection it writes on: "orm" (Django's) or "worker" (the worker's
    psycopg connection, where the worker's and the seed's statements run). ``run``
    returns what its caller gets back, as a number where it is one (rows changed).
    """

    label: str
    run: Callable[[Actor, Subject], Any]
    via: str = "orm"

    def __str__(self) -> str:
        return self.label


@dataclasses.dataclass
class Ran:
    """What a statement run in a race gave back: its value, or what it raised; and whether it waited."""

    value: Any = None
    error: BaseException | None = None
    waited: bool = False

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def settle(future: Future[Any], timeout: float = DEADLINE) -> Ran:
    try:
        return Ran(future.result(timeout=timeout))
    except TimeoutError:
        raise
    except BaseException as error:  # noqa: BLE001 - what the statement raised is part of what it did
        return Ran(error=error)


def run_into(
    holder: Actor, others: list[tuple[Actor, Move]], subject: Subject, waits: bool | None, commit: bool
) -> list[Ran]:
    """``holder`` (already inside its transaction, its statement run) meets the statements of ``others``.

    Each other's statement starts in its own thread; with ``waits`` True each is shown to
    wait on a lock before the holder ends, with False each is shown to complete while the
    holder still holds its locks, with None either. Then the holder commits (or rolls back)
    and every statement's result is collected.
    """
    pending: list[tuple[Actor, Future[Any], Ran]] = []
    ended = False
    try:
        for actor, move in others:
            ran = Ran()
            future = actor.submit(move.run, actor, subject)
            pending.append((actor, future, ran))
            wait_for(lambda a=actor, f=future: f.done() or a.waiting(), DEADLINE, f"{move} to wait or complete")
            if not future.done():
                ran.waited = True
                assert waits is not False, f"{move} waited on a lock the holder's statement took; it should not"
            else:
                assert waits is not True, f"{move} completed without waiting for the holder: {settle(future)}"
        holder.end(commit)
        ended = True
        results = []
        for _actor, future, ran in pending:
            done = settle(future)
            results.append(dataclasses.replace(done, waited=ran.waited))
        return results
    finally:
        if not ended:
            with contextlib.suppress(Exception):
                holder.end(False)
        for actor, future, _ran in pending:
            if not future.done():
                with contextlib.suppress(TimeoutError):
                    future.exception(timeout=DEADLINE)
            if not future.done():
                actor.cancel_statement()
                with contextlib.suppress(Exception):
                    future.exception(timeout=DEADLINE)


# The state of a row, read the same way on any connection.
ROW = """
SELECT tableoid::regclass::text AS "table", status, attempts, worker_id, cancel_requested, started_at, finished_at,
       run_at, error, jsonb_array_length(errors) AS errors, losses, priority, result, pending_parents
FROM axa_queue WHERE id = %s
"""


def read_rows(cursor: Any, job_id: uuid.UUID) -> list[dict[str, Any]]:
    cursor.execute(ROW, [job_id])
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def view(job_id: uuid.UUID) -> dict[str, Any] | None:
    """The row of ``job_id`` as the test's connection sees it now; None if there is none."""
    with connection.cursor() as cursor:
        rows = read_rows(cursor, job_id)
    assert len(rows) <= 1, f"job {job_id} has {len(rows)} rows: {rows}"
    return rows[0] if rows else None


def view_in(actor: Actor, via: str, job_id: uuid.UUID) -> dict[str, Any] | None:
    """The row of ``job_id`` as ``actor``'s connection ``via`` sees it (its own uncommitted writes included)."""

    def read(actor: Actor) -> list[dict[str, Any]]:
        if via == "worker":
            with actor.worker_conn.cursor() as cursor:
                return read_rows(cursor, job_id)
        with connection.cursor() as cursor:
            return read_rows(cursor, job_id)

    rows = actor.call(read, actor)
    assert len(rows) <= 1, f"job {job_id} has {len(rows)} rows in the holder's transaction: {rows}"
    return rows[0] if rows else None


def where(row: dict[str, Any] | None) -> str:
    """A row's state in a word or two: 'completed@history', 'running+cancel@queue', 'gone'."""
    if row is None:
        return "gone"
    flag = "+cancel" if row["cancel_requested"] and row["status"] == "running" else ""
    table = "queue" if row["table"] == "axa_queue" else "history"
    return f"{row['status']}{flag}@{table}"


# Invariants that hold after every interleaving.

DUPLICATES = "SELECT id, count(*) FROM axa_queue GROUP BY id HAVING count(*) > 1"

# Per (name, key) of concurrency-limited jobs: the rows queued and running, against the
# counts axa_flow_key holds plus the deltas not folded yet; the pairs that differ.
FLOW_MISMATCH = """
WITH real AS (
    SELECT name, concurrency_key AS key, count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM axa_queue WHERE concurrency_key IS NOT NULL GROUP BY 1, 2
), counted AS (
    SELECT name, key, sum(queued) AS queued, sum(running) AS running FROM (
        SELECT name, key, queued, running FROM axa_flow_key
        UNION ALL SELECT name, key, queued, running FROM axa_flow_delta) AS c
    GROUP BY 1, 2
)
SELECT coalesce(r.name, c.name), coalesce(r.key, c.key), coalesce(r.queued, 0), coalesce(r.running, 0),
       coalesce(c.queued, 0), coalesce(c.running, 0)
FROM real r FULL JOIN counted c ON c.name = r.name AND c.key = r.key
WHERE coalesce(r.queued, 0) <> coalesce(c.queued, 0) OR coalesce(r.running, 0) <> coalesce(c.running, 0)
"""

# Waiting children whose counter of pending parents is not their edges still to count.
STRANDED = """
SELECT q.id, q.pending_parents, (SELECT count(*) FROM axa_dependency d WHERE d.child_id = q.id AND NOT d.done)
FROM axa_queue q WHERE q.status = 'waiting'
  AND q.pending_parents <> (SELECT count(*) FROM axa_dependency d WHERE d.child_id = q.id AND NOT d.done)
"""


def check_invariants(present: Iterable[uuid.UUID], gone: Iterable[uuid.UUID] = ()) -> None:
    """One row per id; each of ``present`` found by id, each of ``gone`` by no read; per-key counts exact;
    no waiting child whose counter disagrees with its edges."""
    with connection.cursor() as cursor:
        cursor.execute(DUPLICATES)
        assert cursor.fetchall() == [], "two rows with one id"
        cursor.execute(FLOW_MISMATCH)
        assert cursor.fetchall() == [], (
            "axa_flow_key (with its deltas) disagrees with the rows (name, key, real, counted)"
        )
        cursor.execute(STRANDED)
        assert cursor.fetchall() == [], "a waiting child's pending_parents disagrees with its edges"
    for job_id in present:
        assert Job.objects.get(pk=job_id).pk == job_id
    for job_id in gone:
        assert not Job.objects.filter(pk=job_id).exists(), f"job {job_id} should be gone"


# Building rows with the library's own enqueue, claims and finish.


def register(conn: psycopg.Connection[Any], worker: uuid.UUID, names: list[str]) -> None:
    """Register a worker as runworker does (sql.REGISTER)."""
    conn.execute(
        sql.REGISTER,
        {
            "worker": worker,
            "hostname": "race-host",
            "pid": os.getpid(),
            "concurrency": 4,
            "queues": "[]",
            "names": json.dumps(names),
            "backends": "[]",
            "lease": 30.0,
        },
    )


def claim(conn: psycopg.Connection[Any], names: list[str], worker: uuid.UUID, ahead: bool = False) -> list[Claimed]:
    """The worker's claim (sql.CLAIM, composed for these names), as its dispatcher runs it."""
    statement = sql.compose(sql.CLAIM, names, [], None)
    rows = conn.execute(statement, {"limit": 10, "ahead": ahead, "worker": worker}).fetchall()
    return [
        Claimed(row[0], row[1], None, row[3], row[4], backend=row[5], args_json=row[2], unmarked=row[6]) for row in rows
    ]


def completed(claimed: Claimed) -> Outcome:
    """A job that returned None: the finisher's commonest outcome (sql.FINISH_COMPLETED)."""
    return Outcome(claimed.id, claimed.name, claimed.attempt, "completed", result="null")


def raised(claimed: Claimed, function: JobFunction[Any, Any], worker: uuid.UUID | None) -> Outcome:
    """The outcome of an attempt that raised (sql.FINISH): failed, or queued again while attempts are left."""
    return failure(claimed, function, RuntimeError("boom"), worker)


def seed_run(conn: psycopg.Connection[Any], statement: str, *params: str | None) -> tuple[int, list[tuple[Any, ...]]]:
    """Run one of the seed's statements with libpq's $n parameters, as sqlx does: (rows changed, rows returned)."""
    result = conn.pgconn.exec_params(statement.encode(), [None if p is None else p.encode() for p in params])
    if result.status not in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
        raise psycopg.DatabaseError((result.error_message or b"").decode())
    rows = [
        tuple(
            None if result.get_value(r, c) is None else result.get_value(r, c).decode() for c in range(result.nfields)
        )
        for r in range(result.ntuples)
    ]
    return int(result.command_tuples or 0), rows


def seed_enqueue_and_claim(conn: psycopg.Connection[Any], name: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    seed_run(conn, SEED_ENQUEUE, str(job_id), name, '{"fail": false}')
    _, rows = seed_run(conn, SEED_CLAIM, "{" + name + "}")
    assert rows and rows[0][0] == str(job_id), rows
    return job_id
