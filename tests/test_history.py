"""Finished jobs move into history tables inheriting axa_queue; RETENTION drops whole tables."""

from __future__ import annotations

import datetime
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from axa_django import Job, dependencies, history, housekeeping, sql
from axa_django.models import Dependency
from tests.conftest import AXA_APPS, Workers, wait_for
from tests.test_cron import Housekeeper, finishes, held
from tests.test_seed_sql import CLAIM as SEED_CLAIM
from tests.test_seed_sql import FINISH as SEED_FINISH
from tests.test_seed_sql import run as seed_run
from tests.testapp import flow_jobs, jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def where() -> dict[str, int]:
    """Rows per table of the queue: axa_queue itself and each history table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text, count(*) FROM axa_queue GROUP BY 1")
        return dict(cursor.fetchall())


def tables() -> list[tuple[int, bool, bool]]:
    """Each history table's number, and whether it was opened and closed, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT number, opened_at IS NOT NULL, closed_at IS NOT NULL FROM axa_history_part ORDER BY number"
        )
        return cursor.fetchall()


def states() -> list[tuple[bool, bool]]:
    """Whether each history table was opened and closed, oldest first."""
    return [(opened, closed) for _, opened, closed in tables()]


def fresh() -> int:
    """Drop the history tables earlier tests closed; return the number of the one open."""
    with connection.cursor() as cursor:
        while history.drop(cursor, datetime.timedelta(0)) is not None:
            pass
    return number()


def number() -> int:
    """The number of the history table open now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT number FROM axa_history_part WHERE opened_at IS NOT NULL AND closed_at IS NULL")
        return cursor.fetchone()[0]


def age(column: str, seconds: float) -> None:
    """Move every history table's ``column`` (opened_at, closed_at) ``seconds`` into the past."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE axa_history_part SET {column} = {column} - make_interval(secs => %s) WHERE {column} IS NOT NULL",
            [seconds],
        )


def test_a_finished_job_moves_to_the_history_and_reads_as_before(workers: Workers, log_file: str) -> None:
    done = jobs.record.perform_later(token="a", log=log_file)
    failed = jobs.count.perform_later(fail=True)
    waiting = jobs.add.perform_later(1, b=2)
    assert where() == {"axa_queue": 3}
    result = workers.manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    assert where() == {"axa_history": 3}
    assert Path(log_file).read_text().split() == ["a"]
    by_id = {job.pk: job for job in Job.objects.all()}
    assert (by_id[done.pk].status, by_id[done.pk].result) == ("completed", "a")
    assert by_id[done.pk].finished_at is not None and by_id[done.pk].started_at is not None
    assert by_id[failed.pk].status == "failed" and by_id[failed.pk].errors[-1]["message"] == "told to fail"
    assert (by_id[waiting.pk].status, by_id[waiting.pk].result) == ("completed", 3)


def test_the_seeds_finish_moves_its_row_and_a_retry_brings_it_back_to_run(workers: Workers) -> None:
    job_id = "5b1b9c9e-4e0e-4a43-9f39-3c1e2f0d7a11"
    seed_run("INSERT INTO axa_queue (id, name, args) VALUES ($1, $2, $3)", job_id, "CountWorker", '{"fail": false}')
    assert seed_run(SEED_CLAIM, "{CountWorker}") == [(job_id, "CountWorker", '{"fail": false}')]
    seed_run(SEED_FINISH, job_id, "failed", "boom")
    assert where() == {"axa_history": 1}
    assert Job.objects.get(pk=job_id).error == "boom"

    assert Job.objects.filter(pk=job_id).retry() == 1
    assert where() == {"axa_queue": 1}
    assert Job.objects.get(pk=job_id).status == "queued"
    result = workers.manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    assert where() == {"axa_history": 1}
    assert Job.objects.get(pk=job_id).status == "completed"


def test_a_cancel_moves_the_row_and_a_limited_jobs_slot_comes_back(workers: Workers) -> None:
    queued = jobs.add.perform_later(1)
    assert Job.objects.filter(pk=queued.pk).cancel() == 1
    assert where() == {"axa_history": 1}
    # A concurrency-limited job: its key's running count goes back to 0 when it moves.
    limited = [flow_jobs.one_per_account.perform_later(account_id=7) for _ in range(2)]
    result = workers.manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in limited])} == {"completed"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(queued), 0), coalesce(sum(running), 0) FROM axa_flow_delta")
        pending = cursor.fetchone()
        cursor.execute("SELECT coalesce(sum(queued), 0), coalesce(sum(running), 0) FROM axa_flow_key")
        folded = cursor.fetchone()
    assert (pending[0] + folded[0], pending[1] + folded[1]) == (0, 0)


def test_retention_closes_the_history_table_and_drops_it_whole(settings: Any) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    old = [jobs.add.perform_later(i) for i in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in old]).update(status="completed")
    parent = jobs.add.perform_later(0)
    Job.objects.filter(pk=parent.pk).update(status="failed")
    child = jobs.add.using(after=[parent]).perform_later(1)  # cancelled at once, its edge counted
    assert Job.objects.get(pk=child.pk).status == "cancelled"
    live = jobs.add.perform_later(9)
    worker = Housekeeper([])

    first = fresh()
    housekeeping.run(worker)  # makes the next table; the open one is too young to close
    assert states() == [(True, False), (False, False)]
    age("opened_at", 3600 / 4)
    housekeeping.run(worker)
    assert states() == [(True, True), (True, False)] and tables()[0][0] == first
    assert where() == {f"axa_history_{first}": 4, "axa_queue": 2}  # the child was inserted finished: it stays
    after = jobs.add.perform_later(5)
    Job.objects.filter(pk=after.pk).update(status="completed")
    assert where()["axa_history"] == 1

    housekeeping.run(worker)  # closed, not yet past RETENTION: kept
    assert where()[f"axa_history_{first}"] == 4
    age("closed_at", 3600)
    housekeeping.run(worker)
    assert where() == {"axa_history": 1, "axa_queue": 2}
    assert set(Job.objects.values_list("pk", flat=True)) == {live.pk, after.pk, child.pk}
    assert not Dependency.objects.filter(child_id=child.pk).exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [f"axa_history_{first}"])
        assert cursor.fetchone()[0] is None
    assert states() == [(True, False), (False, False)] and first not in [number for number, _, _ in tables()]


def test_a_close_waits_for_no_long_transaction_and_gives_up_soon(settings: Any, caplog: Any) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    worker = Housekeeper([])
    first = fresh()
    housekeeping.run(worker)
    age("opened_at", 3600)
    # What pg_dump holds for as long as it runs: a share lock on every table it reads.
    with held("SELECT count(*) FROM axa_queue") as release:
        finishes(lambda: housekeeping.run(worker), release, "the close to give up on the held table")
        assert "housekeeping failed to rotate the history" in caplog.text and "lock timeout" in caplog.text
        job = jobs.add.perform_later(1)
        Job.objects.filter(pk=job.pk).update(status="completed")  # finishes go on meanwhile
    assert where() == {"axa_history": 1}
    housekeeping.run(worker)
    assert where() == {f"axa_history_{first}": 1}


def test_closing_tables_while_a_worker_drains_loses_and_repeats_nothing(
    settings: Any, workers: Workers, log_file: str
) -> None:
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "RETENTION": 3600}
    tokens = [str(i) for i in range(3000)]
    jobs.record.perform_later_many([{"token": t, "log": log_file} for t in tokens])
    stop = threading.Event()
    closed: list[int] = []

    def rotate() -> None:
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "UPDATE axa_history_part SET opened_at = opened_at - interval '1 hour' "
                        "WHERE closed_at IS NULL AND opened_at IS NOT NULL"
                    )
                housekeeping.run(Housekeeper([]))
                closed[:] = [number for number, _, shut in tables() if shut]
        finally:
            connection.close()

    thread = threading.Thread(target=rotate)
    thread.start()
    try:
        workers.start("--concurrency", "4")
        wait_for(lambda: Job.objects.filter(status="completed").count() == len(tokens), 120, "every job done")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert len(closed) >= 2, closed
    assert sorted(Path(log_file).read_text().split(), key=int) == tokens
    assert Job.objects.count() == len(tokens)
    spread = where()
    assert "axa_queue" not in spread and sum(spread.values()) == len(tokens)


def test_history_tables_are_named_for_their_numbers_and_copy_every_index() -> None:
    fresh()
    with connection.cursor() as cursor:
        history.prepare(cursor)
        cursor.execute("SELECT number FROM axa_history_part WHERE opened_at IS NULL")
        following = cursor.fetchone()[0]
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'axa_history_next'::regclass ORDER BY 1"
        )
        copied = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'axa_queue'::regclass ORDER BY 1"
        )
        parent = [row[0] for row in cursor.fetchall()]
        assert not history.prepare(cursor)  # made once
    assert copied == [f"axa_history_{following}" + name[len("axa_queue") :] for name in parent]


def test_values_the_orm_would_never_write_survive_the_move() -> None:
    job = jobs.add.perform_later({"deep": [[[[1]]]]}, b={"x": 1})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axa_queue SET status = 'completed', result = %s::jsonb, error = %s WHERE id = %s",
            [json.dumps({"n": 10**30}), "'; DROP TABLE axa_queue; -- %s {0}", job.pk],
        )
    moved = Job.objects.get(pk=job.pk)
    assert moved.result == {"n": 10**30} and moved.args["a"]["deep"] == [[[[1]]]]
    assert moved.error == "'; DROP TABLE axa_queue; -- %s {0}"
    assert where() == {"axa_history": 1}


def test_every_history_table_has_every_index_of_axa_queue() -> None:
    # The migration's first history table too: made after axa_queue's indexes, not before
    # the migration's deferred ones (a table without them read by sequential scans).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.inhrelid::regclass::text, (SELECT count(*) FROM pg_index x WHERE x.indrelid = i.inhrelid) "
            "FROM pg_inherits i WHERE i.inhparent = 'axa_queue'::regclass"
        )
        children = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = 'axa_queue'::regclass")
        parent = cursor.fetchone()[0]
    assert "axa_history" in children and parent >= 18
    assert children == dict.fromkeys(children, parent)


def test_the_columns_a_move_copies_are_every_column_of_the_table() -> None:
    # FINISH and the retry move rows by this list: a column left out would be lost on the way.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'axa_queue'::regclass AND attnum > 0 "
            "AND NOT attisdropped"
        )
        columns = {row[0] for row in cursor.fetchall()}
    listed = [column.strip() for column in sql.HISTORY_COLUMNS.split(",")]
    assert len(listed) == len(set(listed)) and set(listed) == columns


def test_a_retry_moves_failed_rows_back_as_one_set_keeping_every_other_value() -> None:
    # The per-row revive (an UPDATE in the history, then a planned-afresh DELETE and an
    # INSERT per row in axa_history_revive) was most of a bulk retry's cost.
    fresh()
    made = [jobs.add.perform_later({"deep": [[[[i]]]]}, b={"n": 10**30}) for i in range(30)]
    ids = [job.pk for job in made]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE axa_queue SET status = 'failed', attempts = 3, losses = 1, started_at = now(), "
            "finished_at = now(), error = %s, errors = '[{\"attempt\": 3}]', priority = 7 WHERE id = ANY(%s)",
            ["'; DROP TABLE axa_queue; -- %s {0}", ids],
        )
        cursor.execute("SELECT * FROM axa_queue WHERE id = ANY(%s) ORDER BY id", [ids])
        names = [column.name for column in cursor.description]
        before = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        assert where() == {"axa_history": 30}
        statement = dependencies.RETRY.format(candidates="WHERE q.id = ANY(%s)")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, [ids])
        plan = cursor.fetchone()[0]
        fired = {
            t["Trigger Name"]: t["Calls"] for t in (plan if isinstance(plan, list) else json.loads(plan))[0]["Triggers"]
        }
        assert "axa_history_revive" not in fired and fired["axa_queue_notify"] == 1, fired
    # EXPLAIN ANALYZE ran it: the rows are back in axa_queue, queued, as a retry leaves them.
    assert where() == {"axa_queue": 30}
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM axa_queue WHERE id = ANY(%s) ORDER BY id", [ids])
        after = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    reset = {"status", "run_at", "started_at", "finished_at", "worker_id", "attempts", "losses", "updated_at"}
    for old, new in zip(before, after, strict=True):
        assert {k: new[k] for k in reset - {"run_at", "updated_at"}} == {
            "status": "queued",
            "started_at": None,
            "finished_at": None,
            "worker_id": None,
            "attempts": 0,
            "losses": 0,
        }
        assert {k: v for k, v in new.items() if k not in reset} == {k: v for k, v in old.items() if k not in reset}
    assert Job.objects.get(pk=ids[0]).args["a"]["deep"] == [[[[0]]]]


def test_a_retry_carries_over_rows_no_orm_would_write() -> None:
    # Written by SQL: args nested 10,000 deep, a 5,000-digit number, run_at 'infinity', a name
    # and a key that look like SQL and format strings; failed in the history, then retried.
    deep = "[" * 10_000 + "1" + "]" * 10_000
    name = "x'); DROP TABLE axa_queue; -- %(id)s {0} %s"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, unique_key, run_at, status, attempts, finished_at) "
            "VALUES (gen_random_uuid(), %s, jsonb_build_object('deep', %s::jsonb, 'n', %s::numeric), %s, "
            "'infinity', 'queued', 1, NULL) RETURNING id",
            [name, deep, "9" * 5_000, name],
        )
        job_id = cursor.fetchone()[0]
        cursor.execute("UPDATE axa_queue SET status = 'failed', finished_at = now() WHERE id = %s", [job_id])
        cursor.execute("SELECT args::text FROM axa_queue WHERE id = %s", [job_id])
        args = cursor.fetchone()[0]
    assert where().get("axa_history") == 1
    assert int(Job.objects.filter(pk=job_id).retry()) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text, status, name, unique_key, args::text, run_at FROM axa_queue WHERE id = %s",
            [job_id],
        )
        table, status, kept_name, key, kept_args, run_at = cursor.fetchone()
    assert (table, status, kept_name, key, kept_args) == ("axa_queue", "queued", name, name, args)
    assert run_at is not None  # a retry runs it now, whatever its run_at was
