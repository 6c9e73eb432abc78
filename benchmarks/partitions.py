"""A prototype, not the product: what table shapes cost per job, before one is chosen.

Issue 22 asks for retention in O(1) (dropping partitions, not deleting rows). This
measured the shapes on the real migrated table, its indexes and triggers, with the
worker's claim and finish statements, at a steady rate, before the product took the
``inherit`` shape: each run sets the product's history table aside and starts from the
table as it was then (the finish updating the row in place, ``PLAIN_FINISH``).

- ``plain``: that table; retention deletes old finished rows in batches (the statement
  RETENTION ran then).
- ``archive``: ``axa_queue`` partitioned by a ``part`` column; every row is written to and
  finished in the live partition (``part`` 0), and a maintenance loop moves finished rows
  older than ``--archive-after`` seconds into a history partition of their minute;
  retention drops history partitions.
- ``move``: the same partitions, but the finish itself moves the row into its minute's
  history partition; retention drops partitions. A claim that meets a row another worker
  claimed and finished since its snapshot fails with SQLSTATE 40001 ("tuple to be locked
  was already moved to another partition"): counted, the claim run again.
- ``rotate``: a ring of ``--parts`` LIST partitions by enqueue time (a ``part`` column whose
  default is the partition written to now), finished in place; every ``retention / 2``
  seconds the oldest partition's rows still needed move to the current one and it is
  TRUNCATEd and written to next. ``rotate-direct``: the same, the claim and finish aimed
  at the current partition.
- ``ready``: the ready set in a table of its own (``axa_ready``, filled by a statement
  trigger); a claim deletes from it and updates the job row, which keeps only the indexes
  no claim or finish changes (primary key, ``created_at``), so both update it in place
  (HOT). An upper bound: the admin's and the history's indexes on status are gone.
- ``history``: ``axa_queue`` keeps queued and running rows; the finish deletes a finished
  row from it and inserts it into ``axa_history``, partitioned by the minute it finished
  (a retry is still updated in place); retention drops history partitions. A claim that
  meets a row finished since its snapshot finds it deleted and skips it: no 40001.
- ``inherit``: the same move, into a history table that INHERITS ``axa_queue`` (plain table
  inheritance, not declarative partitioning), so that every reader of ``axa_queue`` (the
  admin, the ORM, the seed's statements) still sees the finished rows without a change;
  the claims and the finish say ``ONLY axa_queue``. A new history table every
  ``retention / 4``; retention drops the tables whose newest row is older than it.

``python benchmarks/partitions.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres``
runs each shape in turn (``--shape`` for one) and prints one line per shape: jobs run per
second, PostgreSQL CPU per job (the run's own backends), claim time, 40001 errors and
what the table held at the end. ``--hold-snapshot`` keeps a REPEATABLE READ snapshot open
from the end of the warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

import psycopg  # noqa: E402
from psycopg import errors  # noqa: E402

from benchmarks import measure  # noqa: E402
from benchmarks.run import fresh_database  # noqa: E402

NAME = "proto.noop"
MINUTE = "(floor(extract(epoch FROM now()) / 60))::int8"
FINISHED = ["completed", "failed", "cancelled"]


def migrate(url: str) -> None:
    """Migrate, then set the product's history table aside: every shape starts from one plain table."""
    env = dict(os.environ, DATABASE_URL=url)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER axa_history_keep ON axa_queue")
        conn.execute("DROP TABLE axa_history")


def _set_aside(conn: psycopg.Connection[Any]) -> tuple[list[Any], list[Any], str]:
    """Rename axa_queue to axa_queue_old, its triggers and indexes dropped (in the caller's transaction).

    Returns what to rebuild on the new table: its indexes (name, definition) but the
    primary key, its triggers' definitions, and its storage parameters as a WITH clause.
    """
    old_indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'axa_queue' AND indexname <> 'axa_queue_pkey'"
    ).fetchall()
    triggers = conn.execute(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'axa_queue'::regclass AND NOT tgisinternal"
    ).fetchall()
    options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'axa_queue'::regclass").fetchone()[0]
    conn.execute("ALTER TABLE axa_queue RENAME TO axa_queue_old")
    conn.execute("ALTER TABLE axa_queue_old RENAME CONSTRAINT axa_queue_pkey TO axa_queue_old_pkey")
    for (definition,) in triggers:
        conn.execute(f"DROP TRIGGER {definition.split()[2]} ON axa_queue_old")
    for name, _ in old_indexes:
        conn.execute(f"DROP INDEX {name}")
    return old_indexes, triggers, f" WITH ({', '.join(options)})" if options else ""


def partition(conn: psycopg.Connection[Any]) -> None:
    """Rebuild axa_queue as a table partitioned by ``part``: 0 live, then one partition a minute."""
    with conn.transaction():
        old_indexes, triggers, with_options = _set_aside(conn)
        conn.execute(
            "CREATE TABLE axa_queue (LIKE axa_queue_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
            "part int8 NOT NULL DEFAULT 0) PARTITION BY RANGE (part)"
        )
        conn.execute(f"CREATE TABLE axa_queue_live PARTITION OF axa_queue FOR VALUES FROM (0) TO (1){with_options}")
        conn.execute("ALTER TABLE axa_queue ADD PRIMARY KEY (id, part)")
        for _name, definition in old_indexes:
            definition = definition.replace(" ON public.axa_queue ", " ON public.axa_queue_live ")
            if "UNIQUE" in definition:
                # Every queued or running row is in the live partition: unique there is unique.
                conn.execute(definition)
                continue
            conn.execute(definition.replace(" ON public.axa_queue_live ", " ON public.axa_queue "))
        for (definition,) in triggers:
            conn.execute(definition.replace(" ON public.axa_queue ", " ON axa_queue "))
        conn.execute("DROP TABLE axa_queue_old")


def rotating(conn: psycopg.Connection[Any], parts: int) -> None:
    """Rebuild axa_queue as LIST partitions on ``part``; inserts go to the current one."""
    with conn.transaction():
        conn.execute("CREATE TABLE axa_queue_rotation (current int2 NOT NULL, rotated_at timestamptz NOT NULL)")
        conn.execute("INSERT INTO axa_queue_rotation VALUES (0, now())")
        conn.execute(
            "CREATE FUNCTION axa_queue_part() RETURNS int2 LANGUAGE sql STABLE "
            "AS 'SELECT current FROM axa_queue_rotation'"
        )
        old_indexes, triggers, with_options = _set_aside(conn)
        conn.execute(
            "CREATE TABLE axa_queue (LIKE axa_queue_old INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
            "part int2 NOT NULL DEFAULT axa_queue_part()) PARTITION BY LIST (part)"
        )
        for n in range(parts):
            conn.execute(f"CREATE TABLE axa_queue_p{n} PARTITION OF axa_queue FOR VALUES IN ({n}){with_options}")
        conn.execute("ALTER TABLE axa_queue ADD PRIMARY KEY (id, part)")
        for _name, definition in old_indexes:
            if "UNIQUE" not in definition:  # a key table would take its place
                conn.execute(definition)
        for (definition,) in triggers:
            conn.execute(definition.replace(" ON public.axa_queue ", " ON axa_queue "))
        conn.execute("DROP TABLE axa_queue_old")


def ready_apart(conn: psycopg.Connection[Any]) -> None:
    """The ready set in a table of its own; job rows keep only indexes a claim or finish never changes.

    An upper bound, not a product: the admin's and the history's indexes on status go, so
    that a claim and a finish can update the job row in place (HOT).
    """
    hot_path = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'axa_queue' "
        "AND indexname NOT IN ('axa_queue_pkey', 'axa_queue_created')"
    ).fetchall()
    with conn.transaction():
        for (name,) in hot_path:
            conn.execute(f"DROP INDEX {name}")
        conn.execute(
            "CREATE TABLE axa_ready (id uuid PRIMARY KEY, name text NOT NULL, priority int NOT NULL, "
            "run_at timestamptz NOT NULL) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01)"
        )
        conn.execute("CREATE INDEX axa_ready_claim ON axa_ready (name, priority DESC, run_at)")
        conn.execute(
            "CREATE FUNCTION axa_ready_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO axa_ready SELECT id, name, priority, run_at FROM inserted WHERE status = 'queued'; "
            "RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE TRIGGER axa_ready_insert AFTER INSERT ON axa_queue REFERENCING NEW TABLE AS inserted "
            "FOR EACH STATEMENT EXECUTE FUNCTION axa_ready_insert()"
        )


def history_apart(conn: psycopg.Connection[Any]) -> None:
    """``axa_history``: finished rows, partitioned by the minute they finished, with the admin's indexes."""
    with conn.transaction():
        conn.execute(
            "CREATE TABLE axa_history (LIKE axa_queue INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            "PARTITION BY RANGE (finished_at)"
        )
        conn.execute("ALTER TABLE axa_history ALTER finished_at SET NOT NULL")
        conn.execute("ALTER TABLE axa_history ADD PRIMARY KEY (id, finished_at)")
        conn.execute("CREATE INDEX axa_history_created ON axa_history (created_at DESC)")
        conn.execute(
            "CREATE INDEX axa_history_failed ON axa_history (finished_at DESC, id DESC) WHERE status = 'failed'"
        )
        conn.execute(
            "CREATE INDEX axa_history_status ON axa_history (status, created_at DESC) WHERE status <> 'completed'"
        )
        conn.execute("CREATE INDEX axa_history_workflow ON axa_history (workflow_id) WHERE workflow_id IS NOT NULL")
        # What only finished rows use leaves the hot table.
        conn.execute("DROP INDEX axa_queue_failed")
        conn.execute("DROP INDEX axa_queue_finished")


def completed(rows: list[tuple[Any, ...]]) -> str:
    """The FINISH document saying each claimed row completed now, returning nothing."""
    now = time.time()
    outcome = {"status": "completed", "error": None, "result": {"v": None}, "entry": None, "delay": 0, "started": now}
    return json.dumps([{"id": str(row[0]), **outcome} for row in rows])


def inherit_child(conn: psycopg.Connection[Any], number: int) -> str:
    """A history table inheriting axa_queue, with its parent's indexes (those on active statuses stay empty)."""
    child = f"axa_history_{number}"
    conn.execute(f"CREATE TABLE {child} () INHERITS (axa_queue)")
    for name, definition in conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'axa_queue'"
    ).fetchall():
        conn.execute(
            definition.replace("UNIQUE ", "").replace(
                f"INDEX {name} ON public.axa_queue ", f"INDEX {child}{name[len('axa_queue') :]} ON public.{child} "
            )
        )
    return child


# The worker's FINISH before finished jobs moved into the history: the row updated in
# place. The shapes below were measured against it.
PLAIN_FINISH = """
UPDATE axa_queue q
SET status = v.status,
    error = CASE WHEN v.status = 'completed' THEN q.error ELSE v.error END,
    result = v.result -> 'v',
    errors = CASE WHEN v.entry IS NULL THEN q.errors ELSE q.errors || jsonb_build_array(v.entry) END,
    run_at = CASE WHEN v.status = 'queued' THEN now() + make_interval(secs => v.delay) ELSE q.run_at END,
    started_at = CASE WHEN v.status = 'queued' THEN NULL ELSE COALESCE(q.started_at, to_timestamp(v.started)) END,
    worker_id = CASE WHEN v.status = 'queued' THEN NULL ELSE q.worker_id END,
    finished_at = CASE WHEN v.status = 'queued' THEN NULL ELSE now() END,
    updated_at = now()
FROM jsonb_to_recordset(%(outcomes)s::jsonb)
    AS v(id uuid, status text, error text, result jsonb, entry jsonb, delay float8, started float8)
WHERE q.id = v.id AND q.status || '' = 'running' AND q.worker_id IS NOT DISTINCT FROM %(worker)s
  AND NOT q.has_children
RETURNING q.id, set_config('synchronous_commit', 'off', true)
"""


READY_CLAIM = """
WITH taken AS (
    DELETE FROM axa_ready WHERE id = ANY(ARRAY(
        SELECT id FROM axa_ready WHERE name = %(name)s AND run_at <= now()
        ORDER BY priority DESC, run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    )) RETURNING id
)
UPDATE axa_queue q SET status = 'running', updated_at = now(), started_at = now(),
    attempts = q.attempts + 1, worker_id = %(worker)s
FROM taken WHERE q.id = taken.id
RETURNING q.id, q.name, q.args::text, q.attempts
"""


# Shapes whose hot table is axa_queue itself, not a partition of it.
IN_PLACE = ("plain", "rotate", "rotate-direct", "ready", "history", "inherit")


def statements(shape: str) -> dict[str, str]:
    import django

    django.setup()
    from axa_django import sql

    claim = sql.compose(sql.CLAIM, [NAME], [], None).replace("ONLY axa_queue", "axa_queue")
    finish = PLAIN_FINISH
    if shape == "ready":
        claim = READY_CLAIM
    if shape == "history":
        finish = sql.FINISH.replace("ONLY axa_queue", "axa_queue")
    if shape == "inherit":
        only = re.compile(r"\b(FROM|UPDATE) axa_queue\b")
        claim = only.sub(r"\1 ONLY axa_queue", claim)
        finish = sql.FINISH.replace("INTO axa_history", "INTO {child}")
    if shape not in IN_PLACE:
        claim = re.sub(r"\baxa_queue\b", "axa_queue_live", claim)
    if shape == "archive":
        finish = finish.replace("UPDATE axa_queue q", "UPDATE axa_queue_live q")
    if shape == "move":
        finish = finish.replace(
            "SET status = v.status,",
            f"SET part = CASE WHEN v.status = 'queued' THEN 0 ELSE {MINUTE} END,\n    status = v.status,",
        ).replace("WHERE q.id = v.id AND", "WHERE q.part = 0 AND q.id = v.id AND")
    return {"claim": claim, "finish": finish}


class Run:
    def __init__(self, args: argparse.Namespace, url: str, shape: str) -> None:
        self.args, self.url, self.shape = args, url, shape
        self.text = statements(shape)
        self.stop = threading.Event()
        self.measuring = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.enqueued = 0
        self.serialization = 0
        self.other_errors: list[str] = []
        self.claim_ms: list[float] = []
        self.pids: list[int] = []
        self.dropped = 0
        self.moved = 0
        self.current = 0
        self.maintenance_ms = 0.0
        self.child = "axa_history_0"
        self.child_since = time.monotonic()

    def connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True)
        # What a worker's session sets (worker/connection.py).
        conn.execute("SET jit = off; SET enable_seqscan = off; SET enable_bitmapscan = off")
        with self.lock:
            self.pids.append(conn.info.backend_pid)
        return conn

    def produce(self) -> None:
        conn = self.connect()
        batch = 10
        gap = batch / self.args.rate
        due = time.monotonic()
        while not self.stop.is_set():
            conn.execute(
                "INSERT INTO axa_queue (id, name, args) "
                "SELECT gen_random_uuid(), %s, '[]'::jsonb FROM generate_series(1, %s)",
                (NAME, batch),
            )
            with self.lock:
                self.enqueued += batch
            due += gap
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        conn.close()

    def work(self) -> None:
        conn = self.connect()
        worker = uuid.uuid4()
        conn.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, backends, "
            "started_at, heartbeat_at) VALUES (%s, 'proto', 0, 16, 'null', '[]', '[]', now(), now())",
            (worker,),
        )
        claim = self.text["claim"]
        finish = self.text["finish"]
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                if self.shape == "rotate-direct":
                    # Claim and finish in the partition now written to (a floor would add the older ones).
                    part = f"axa_queue_p{self.current}"
                    claim = re.sub(r"\baxa_queue\b", part, self.text["claim"])
                    finish = self.text["finish"].replace("UPDATE axa_queue q", f"UPDATE {part} q")
                params = {"limit": 16, "worker": worker, "ahead": False, "name": NAME}
                rows = conn.execute(claim, params).fetchall()
            except errors.SerializationFailure:
                with self.lock:
                    self.serialization += 1
                continue
            if self.measuring.is_set():
                self.claim_ms.append((time.perf_counter() - started) * 1000)
            if not rows:
                time.sleep(0.002)
                continue
            try:
                text = finish.replace("{child}", self.child)
                written = conn.execute(text, {"outcomes": completed(rows), "worker": worker}).fetchall()
            except psycopg.Error as error:
                self.other_errors.append(f"finish: {error}")
                continue
            with self.lock:
                self.done += len(written)
        conn.close()

    def maintain(self) -> None:
        conn = self.connect()
        conn.execute("SET lock_timeout = '100ms'")
        retention = self.args.retention
        while not self.stop.wait(1.0):
            started = time.perf_counter()
            try:
                if self.shape.startswith("rotate"):
                    self.rotate(conn)
                elif self.shape == "history":
                    self.partitions(conn, "axa_history", "finished_at")
                elif self.shape == "inherit":
                    self.inherit(conn)
                elif self.shape in ("plain", "ready"):
                    while True:
                        deleted = conn.execute(
                            "DELETE FROM axa_queue WHERE id = ANY(ARRAY(SELECT id FROM axa_queue "
                            "WHERE status = ANY(%s) AND created_at < now() - make_interval(secs => %s) "
                            "AND updated_at < now() - make_interval(secs => %s) LIMIT 5000 FOR UPDATE SKIP LOCKED))",
                            (FINISHED, retention, retention),
                        ).rowcount
                        if deleted < 5000:
                            break
                else:
                    self.partitions(conn)
                    if self.shape == "archive":
                        while True:
                            moved = conn.execute(
                                f"UPDATE axa_queue SET part = {MINUTE} WHERE part = 0 AND id = ANY(ARRAY("
                                "SELECT id FROM axa_queue_live WHERE status = ANY(%s) "
                                "AND finished_at < now() - make_interval(secs => %s) "
                                "LIMIT 5000 FOR UPDATE SKIP LOCKED))",
                                (FINISHED, self.args.archive_after),
                            ).rowcount
                            if moved < 5000:
                                break
            except psycopg.Error as error:
                self.other_errors.append(f"maintenance: {error}")
            if self.measuring.is_set():
                self.maintenance_ms += (time.perf_counter() - started) * 1000
        conn.close()

    def inherit(self, conn: psycopg.Connection[Any]) -> None:
        """Every retention / 4: a new history table; drop those whose newest row is older than the retention."""
        if time.monotonic() - self.child_since >= self.args.retention / 4:
            number = int(self.child.rsplit("_", 1)[1]) + 1
            with conn.transaction():
                child = inherit_child(conn, number)
            self.child = child  # only once committed: the finishers write to it at once
            self.child_since = time.monotonic()
        children = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'axa_queue'::regclass AND c.relname <> %s",
            (self.child,),
        ).fetchall()
        for (child,) in children:
            newest = conn.execute(
                f"SELECT max(finished_at) < now() - make_interval(secs => %s) FROM {child}", (self.args.retention,)
            ).fetchone()[0]
            if newest:
                try:
                    conn.execute(f"DROP TABLE {child}")
                    self.dropped += 1
                except errors.LockNotAvailable:
                    pass

    def rotate(self, conn: psycopg.Connection[Any]) -> None:
        """Every retention / 2: empty the oldest partition (its needed rows moved out) and write there next."""
        parts = self.args.parts
        current, age = conn.execute(
            "SELECT current, extract(epoch FROM now() - rotated_at) FROM axa_queue_rotation"
        ).fetchone()
        if age < self.args.retention / (parts - 2):
            return
        oldest = (current + 1) % parts
        try:
            with conn.transaction():
                conn.execute(f"LOCK TABLE axa_queue_p{oldest} IN ACCESS EXCLUSIVE MODE")
                moved = conn.execute(
                    "UPDATE axa_queue SET part = %s WHERE part = %s AND NOT (status = ANY(%s) "
                    "AND finished_at < now() - make_interval(secs => %s))",
                    (current, oldest, FINISHED, self.args.retention),
                ).rowcount
                conn.execute(f"TRUNCATE axa_queue_p{oldest}")
                conn.execute("UPDATE axa_queue_rotation SET current = %s, rotated_at = now()", (oldest,))
            self.current = oldest
            self.dropped += 1
            self.moved += moved
        except errors.LockNotAvailable:
            pass

    def partitions(self, conn: psycopg.Connection[Any], table: str = "axa_queue", key: str = "part") -> None:
        """Create the next minutes' partitions; drop those wholly older than the retention."""
        now = int(conn.execute(f"SELECT {MINUTE}").fetchone()[0])
        existing = {
            int(name[len(table) + 2 :])
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = %s::regclass AND c.relname <> 'axa_queue_live'",
                (table,),
            )
        }
        for minute in range(now, now + 3):
            if minute not in existing:
                bounds = (
                    (minute, minute + 1)
                    if key == "part"
                    else (f"to_timestamp({minute * 60})", f"to_timestamp({(minute + 1) * 60})")
                )
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table}_m{minute} PARTITION OF {table} "
                    f"FOR VALUES FROM ({bounds[0]}) TO ({bounds[1]})"
                )
        for minute in sorted(existing):
            if (minute + 1) * 60 < time.time() - self.args.retention:
                try:
                    conn.execute(f"DROP TABLE {table}_m{minute}")
                    self.dropped += 1
                except errors.LockNotAvailable:
                    pass

    def run(self) -> dict[str, Any]:
        args = self.args
        holder = None
        threads = [threading.Thread(target=self.produce, daemon=True)]
        threads += [threading.Thread(target=self.work, daemon=True) for _ in range(args.workers)]
        threads += [threading.Thread(target=self.maintain, daemon=True)]
        if self.shape == "history":
            with psycopg.connect(self.url, autocommit=True) as conn:
                self.partitions(conn, "axa_history", "finished_at")
        elif self.shape not in IN_PLACE:
            with psycopg.connect(self.url, autocommit=True) as conn:
                self.partitions(conn)
        for thread in threads:
            thread.start()
        time.sleep(args.warmup)
        if args.hold_snapshot:
            holder = psycopg.connect(self.url)
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT 1 FROM axa_queue LIMIT 1")
        with self.lock:
            pids = list(self.pids)
        cpu0 = {pid: measure.process_cpu(pid) or 0.0 for pid in pids}
        done0, started = self.done, time.monotonic()
        self.measuring.set()
        time.sleep(args.seconds)
        cpu1 = {pid: measure.process_cpu(pid) or 0.0 for pid in pids}
        done1, elapsed = self.done, time.monotonic() - started
        self.measuring.clear()
        with psycopg.connect(self.url, autocommit=True) as conn:
            figures = self.table(conn)
        self.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if holder is not None:
            holder.close()
        with psycopg.connect(self.url, autocommit=True) as conn:
            twice = conn.execute("SELECT count(*) FROM axa_queue WHERE attempts > 1").fetchone()[0]
            if self.shape == "history":
                twice += conn.execute("SELECT count(*) FROM axa_history WHERE attempts > 1").fetchone()[0]
        jobs = done1 - done0
        return {
            "shape": self.shape,
            "jobs_per_s": jobs / elapsed,
            "pg_cpu_ms_per_job": sum(cpu1[p] - cpu0[p] for p in pids) * 1000 / max(jobs, 1),
            "claim_ms_p50": statistics.median(self.claim_ms) if self.claim_ms else None,
            "claim_ms_p99": statistics.quantiles(self.claim_ms, n=100)[98] if len(self.claim_ms) > 100 else None,
            "serialization_failures": self.serialization,
            "claims": len(self.claim_ms),
            "other_errors": self.other_errors[:5],
            "claimed_twice": twice,
            "partitions_dropped": self.dropped,
            "rows_moved": self.moved,
            "maintenance_ms_per_s": self.maintenance_ms / elapsed,
            **figures,
        }

    def table(self, conn: psycopg.Connection[Any]) -> dict[str, Any]:
        live = "axa_queue" if self.shape in IN_PLACE else "axa_queue_live"
        sizes = conn.execute(
            "SELECT sum(pg_indexes_size(relid))::int8, sum(n_dead_tup)::int8, sum(n_live_tup)::int8, "
            "sum(pg_table_size(relid))::int8, sum(n_tup_hot_upd)::int8, sum(n_tup_upd)::int8, "
            "sum(autovacuum_count)::int8 FROM pg_stat_user_tables "
            "WHERE relname = %s OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass)",
            (live, live),
        ).fetchone()
        rows = conn.execute("SELECT count(*) FROM axa_queue").fetchone()[0]
        parent = "axa_history" if self.shape == "history" else "axa_queue"
        parts = conn.execute("SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass", (parent,)).fetchone()[0]
        if self.shape == "history":
            rows += conn.execute("SELECT count(*) FROM axa_history").fetchone()[0]
        return {
            "hot_table": live,
            "hot_indexes_mb": float(sizes[0]) / 1e6,
            "hot_dead_tuples": sizes[1],
            "hot_live_tuples": sizes[2],
            "table_mb": float(sizes[3]) / 1e6,
            "hot_updates": sizes[4] / max(sizes[5], 1),
            "autovacuums": sizes[6],
            "rows": rows,
            "partitions": parts,
        }


def drain(args: argparse.Namespace, url: str, shape: str) -> dict[str, Any]:
    """Enqueue ``--drain`` rows, then claim and finish them all as fast as ``--workers`` connections can."""
    text = statements(shape)
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(0, args.drain, 10_000):
            conn.execute(
                "INSERT INTO axa_queue (id, name, args) SELECT gen_random_uuid(), %s, '[]'::jsonb "
                "FROM generate_series(1, %s)",
                (NAME, min(10_000, args.drain - start)),
            )
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        statements_on = bool(
            conn.execute(
                "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements' "
                "AND current_setting('shared_preload_libraries') ~ 'pg_stat_statements'"
            ).fetchone()
        )
        if statements_on:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
    run = Run(args, url, shape)
    conns = [run.connect() for _ in range(args.workers)]
    cpu0 = {pid: measure.process_cpu(pid) or 0.0 for pid in run.pids}
    done: list[int] = []

    def work(conn: psycopg.Connection[Any]) -> None:
        worker = uuid.uuid4()
        count = 0
        while True:
            rows = conn.execute(
                text["claim"], {"limit": args.batch, "worker": worker, "ahead": False, "name": NAME}
            ).fetchall()
            if not rows:
                break
            finish = text["finish"].replace("{child}", run.child)
            count += len(conn.execute(finish, {"outcomes": completed(rows), "worker": worker}).fetchall())
        done.append(count)

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(conn,)) for conn in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    cpu1 = {pid: measure.process_cpu(pid) or 0.0 for pid in run.pids}
    jobs = sum(done)
    result: dict[str, Any] = {
        "shape": shape,
        "drained": jobs,
        "jobs_per_s": jobs / elapsed,
        "pg_cpu_ms_per_job": sum(cpu1[p] - cpu0[p] for p in run.pids) * 1000 / max(jobs, 1),
    }
    with psycopg.connect(url, autocommit=True) as conn:
        if statements_on:
            exec_us, wal, wal_bytes, fpi, buffers = conn.execute(
                "SELECT sum(total_exec_time) * 1000, sum(wal_records), sum(wal_bytes), sum(wal_fpi), "
                "sum(shared_blks_hit + shared_blks_read) "
                "FROM pg_stat_statements WHERE query ~ '^\\s*(WITH|UPDATE|DELETE)'"
            ).fetchone()
            result |= {
                "exec_us_per_job": float(exec_us) / jobs,
                "wal_per_job": float(wal) / jobs,
                "wal_bytes_per_job": float(wal_bytes) / jobs,
                "full_page_images_per_job": float(fpi) / jobs,
                "buffers_per_job": float(buffers) / jobs,
            }
            result["statements"] = [
                f"{calls} calls {float(us) / jobs:.1f} us/job {float(w) / jobs:.1f} WAL/job: {query[:40]}"
                for calls, us, w, query in conn.execute(
                    "SELECT calls, total_exec_time * 1000, wal_records, regexp_replace(query, '\\s+', ' ', 'g') "
                    "FROM pg_stat_statements WHERE query ~ '^\\s*(WITH|UPDATE|DELETE)' ORDER BY 2 DESC LIMIT 3"
                )
            ]
        left = conn.execute("SELECT count(*) FROM axa_queue WHERE status = 'queued'").fetchone()[0]
        result["table_mb"] = float(conn.execute("SELECT pg_table_size('axa_queue') / 1e6").fetchone()[0])
    for conn in conns:
        conn.close()
    return result | {"left_queued": left}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("DATABASE_URL"), required="DATABASE_URL" not in os.environ)
    shapes = ["plain", "archive", "move", "rotate", "rotate-direct", "ready", "history", "inherit"]
    parser.add_argument("--shape", action="append", choices=shapes)
    parser.add_argument("--parts", type=int, default=4, help="rotate: partitions in the ring")
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs enqueued per second")
    parser.add_argument("--workers", type=int, default=2, help="claiming connections, racing")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured after the warm-up")
    parser.add_argument("--retention", type=float, default=60.0, help="seconds a finished row is kept")
    parser.add_argument("--archive-after", type=float, default=5.0, help="archive: seconds before a finished row moves")
    parser.add_argument("--hold-snapshot", action="store_true")
    parser.add_argument("--drain", type=int, default=0, help="enqueue this many rows, then drain them (no rate)")
    parser.add_argument("--batch", type=int, default=50, help="--drain: rows per claim")
    parser.add_argument(
        "--storage-defaults",
        action="store_true",
        help="reset axa_queue's storage parameters (fillfactor, autovacuum) to PostgreSQL's defaults first",
    )
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    results = []
    for shape in args.shape or ["plain", "archive", "move"]:
        database = "axa_part_" + shape.replace("-", "_")
        url = fresh_database(args.url, database)
        migrate(url)
        if shape.startswith("rotate"):
            with psycopg.connect(url, autocommit=True) as conn:
                rotating(conn, args.parts)
        elif shape == "ready":
            with psycopg.connect(url, autocommit=True) as conn:
                ready_apart(conn)
        elif shape == "history":
            with psycopg.connect(url, autocommit=True) as conn:
                history_apart(conn)
        elif shape == "inherit":
            with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
                inherit_child(conn, 0)
        elif shape != "plain":
            with psycopg.connect(url, autocommit=True) as conn:
                partition(conn)
        with psycopg.connect(url, autocommit=True) as conn:
            if args.storage_defaults:
                conn.execute(
                    "ALTER TABLE axa_queue RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                    "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)"
                )
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
        if shape == "history":
            with psycopg.connect(url, autocommit=True) as conn:
                Run(args, url, shape).partitions(conn, "axa_history", "finished_at")
        if args.drain:
            result = drain(args, url, shape) | {"storage_defaults": args.storage_defaults}
        else:
            result = Run(args, url, shape).run() | {"storage_defaults": args.storage_defaults}
        results.append(result)
        print(json.dumps(result), flush=True)
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
