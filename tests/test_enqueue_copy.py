"""A bulk enqueue goes in by COPY when the database computes nothing for its rows; it stores what the INSERT stores."""

import datetime
import zoneinfo

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.signals import post_init
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils.functional import SimpleLazyObject

from axa_django import Job, enqueue_many
from tests.conftest import AXA_APPS
from tests.testapp import jobs
from tests.testapp.flow_jobs import five_per_second, one_per_account

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

# What COPY's text format gives a meaning to (tab, newline, carriage return, backslash,
# its NULL and end-of-data markers), and what SQL and format strings do.
ODD = [
    "tab\there",
    "line\nbreak",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\.",
    "ends in \\",
    "\\\\t",
    "%s %(x)s {0} %%",
    "'; DROP TABLE axa_queue; --",
    'say "hi"',
    "é ✓ 🎉 \u2028\u2029 \x7f",
    "",
]
# Names, queues and keys refuse control characters; everything else is theirs.
ODD_NAME = "odd\\name %s {0} '; --"


def _last_statement() -> str:
    """The last statement this test's connection ran, as another session sees it."""
    pid = connection.connection.info.backend_pid
    with psycopg.connect(connection.connection.info.dsn, password=connection.settings_dict["PASSWORD"]) as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None
    return row[0]


def _batches() -> list[tuple[str, list[Job]]]:
    """Enqueue every odd value in bulk through each column a COPY writes; return (what, jobs)."""
    args = [{"s": s, "nested": [s, {s: [s, -1.5, 5e-324, 2**63]}]} for s in ODD]
    done = [("by name", enqueue_many(ODD_NAME, args))]
    odd_options = jobs.add.using(queue="q\\ueue %s", priority=-7, max_attempts=3, timeout=1.5, max_losses=2)
    done.append(("options", odd_options.perform_later_many([{"a": s} for s in ODD])))
    keyed = one_per_account.using(concurrency_key="k\\ey %s '")
    done.append(("concurrency key", keyed.perform_later_many([{"account_id": 1, "token": s} for s in ODD])))
    done.append(("rate key", five_per_second.perform_later_many([{"api": f"api\\{s!r}", "token": s} for s in ODD])))
    return done


_COMPARED = [
    "name", "args", "status", "queue", "priority", "attempts", "max_attempts", "losses", "max_losses", "errors",
    "unique_key", "backend", "timeout", "concurrency_key", "rate_key", "pending_parents", "has_children",
    "cancel_requested", "worker_id", "finished_at", "result", "error", "started_at",
]  # fmt: skip


def _stored(created: list[Job]) -> list[tuple[object, ...]]:
    by_id = {job.pk: job for job in Job.objects.filter(pk__in=[job.pk for job in created])}
    return [tuple(getattr(by_id[job.pk], field) for field in _COMPARED) for job in created]


def test_a_bulk_enqueue_by_copy_stores_odd_values_as_the_insert_does():
    copied = []
    for what, created in _batches():
        assert _last_statement().startswith("COPY axa_queue"), what
        copied.append((what, created))
    # Under Django's query capture the same batches go in by INSERT ... RETURNING.
    with CaptureQueriesContext(connection):
        inserted = _batches()
    assert _last_statement().startswith("INSERT INTO axa_queue")
    for (what, by_copy), (_, by_insert) in zip(copied, inserted, strict=True):
        assert _stored(by_copy) == _stored(by_insert), what
        # The jobs returned say what their rows say, without a query.
        said = ["id", "name", "args", "status", "queue", "priority", "max_attempts", "unique_key", "backend"]
        rows = {job.pk: job for job in Job.objects.filter(pk__in=[job.pk for job in by_copy])}
        assert [[getattr(job, f) for f in said] for job in by_copy] == [
            [getattr(rows[job.pk], f) for f in said] for job in by_copy
        ], what
        assert [job.args for job in by_copy] == [Job.objects.get(pk=job.pk).args for job in by_copy], what
    by_name = Job.objects.filter(pk__in=[job.pk for job in copied[0][1]])
    assert sorted(job.args["s"] for job in by_name) == sorted(ODD)
    row = Job.objects.get(pk=copied[1][1][0].pk)
    assert (row.queue, row.priority, row.max_attempts, row.timeout, row.max_losses) == ("q\\ueue %s", -7, 3, 1.5, 2)
    # The times come from the column defaults: the statement's time, as the INSERT's.
    assert row.run_at == row.created_at == row.updated_at
    # The flow counts see COPY's rows as they see the INSERT's: each key counted twice over.
    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(queued) FROM axa_flow_delta WHERE key = %s", ["k\\ey %s '"])
        assert cursor.fetchall() == [(2 * len(ODD),)]


def test_a_bulk_enqueue_refused_mid_copy_writes_nothing_and_leaves_the_connection_usable():
    # A trigger refuses the 2,001st row: the server has read two chunks by then.
    with connection.cursor() as cursor:
        cursor.execute(REFUSE)
    try:
        with pytest.raises(DatabaseError, match="refused row 2000"):
            enqueue_many("x.y", [{"n": n} for n in range(2500)])
        assert _last_statement().startswith("COPY axa_queue")
        assert not Job.objects.exists()
        with transaction.atomic():
            kept = jobs.add.perform_later(1)
            with pytest.raises(DatabaseError, match="refused row 2000"), transaction.atomic():
                enqueue_many("x.y", [{"n": n} for n in range(2500)])
            after = enqueue_many("x.y", [{"n": 1}])
        assert Job.objects.filter(pk__in=[kept.pk, after[0].pk]).count() == 2
        assert Job.objects.count() == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER axa_test_refuse ON axa_queue; DROP FUNCTION axa_test_refuse()")


def test_an_item_found_too_large_mid_copy_writes_nothing_and_leaves_the_callers_transaction_usable():
    # Rows are encoded while the server reads the ones before: item 2,100 is found too
    # large after two chunks went in. The batch writes nothing, in autocommit and inside
    # the caller's transaction, which goes on and commits its own rows.
    calls = [{"n": n} for n in range(2500)]
    calls[2100] = {"n": "x" * 200}
    too_large = r"item 2100: the arguments of job 'x\.y': 208 bytes as JSON, over the limit of 100"
    with override_settings(AXA_DJANGO={"MAX_ARGS_BYTES": 100}):
        with pytest.raises(ValueError, match=too_large):
            enqueue_many("x.y", calls)
        assert _last_statement().startswith("COPY axa_queue")  # begun, then given up
        assert not Job.objects.exists()
        with transaction.atomic():
            kept = jobs.add.perform_later(1)
            with pytest.raises(ValueError, match=too_large):
                enqueue_many("x.y", calls)
            after = enqueue_many("x.y", calls[:3])
    assert set(Job.objects.values_list("pk", flat=True)) == {kept.pk, *(job.pk for job in after)}


def test_a_call_found_bad_mid_copy_writes_nothing_and_leaves_the_callers_transaction_usable():
    # A job whose options no call changes is checked call by call as the COPY goes:
    # item 2,100 is refused after two chunks went in. Nothing is written, in autocommit
    # and inside the caller's transaction, which goes on and commits its own rows.
    calls = [{"a": n} for n in range(2500)]
    calls[2100] = {"a": {1, 2}}
    bad = r"item 2100: argument 'a' of job '[^']*add' is a set"
    with pytest.raises(TypeError, match=bad):
        jobs.add.perform_later_many(calls)
    assert _last_statement().startswith("COPY axa_queue")  # begun, then given up
    assert not Job.objects.exists()
    with transaction.atomic():
        kept = jobs.add.perform_later(1)
        with pytest.raises(TypeError, match=bad):
            jobs.add.perform_later_many(calls)
        after = jobs.add.perform_later_many(calls[:3])
    assert set(Job.objects.values_list("pk", flat=True)) == {kept.pk, *(job.pk for job in after)}
    # A call refused in the first chunk is refused before any SQL.
    with CaptureQueriesContext(connection) as queries, pytest.raises(TypeError, match="item 1: "):
        jobs.add.perform_later_many([{"a": 1}, {"a": b"x"}])
    assert not queries.captured_queries


def test_calls_are_read_whole_before_the_copy_takes_the_connection():
    # A generator over a queryset's iterator() reads through a server-side cursor on the
    # connection the COPY uses; read as the COPY asks for its second chunk, it waited on
    # the connection the COPY held, forever. Each call here says what the connection was
    # doing when it was read.
    states = []

    def status():
        states.append(connection.connection.info.transaction_status)

    def args(n):  # a pair's args, read like a queryset: lazily
        status()
        yield n

    def calls():
        for n in range(1500):
            status()
            yield {"a": n} if n % 2 else (args(n), {})

    connection.ensure_connection()
    created = jobs.add.perform_later_many(calls())
    assert _last_statement().startswith("COPY axa_queue")
    assert set(states) == {psycopg.pq.TransactionStatus.IDLE}
    assert sorted(job.args["a"] for job in Job.objects.filter(pk__in=[job.pk for job in created])) == list(range(1500))


def test_a_lazy_object_in_a_call_read_during_the_copy_is_refused_without_being_loaded():
    # A call checked while the COPY holds the connection: naming what is wrong with a
    # lazy object (request.user) must not load it, a query that would wait forever.
    loaded = []

    def load() -> object:
        loaded.append(connection.connection.info.transaction_status)  # no query: a regression fails, not hangs
        return object()

    calls = [{"a": n} for n in range(2500)]
    calls[1500] = {"a": SimpleLazyObject(load)}
    with pytest.raises(TypeError, match=r"item 1500: argument 'a' of job '[^']*add' is a django\.utils\.functional"):
        jobs.add.perform_later_many(calls)
    assert loaded == []
    assert not Job.objects.exists()
    # A model instance still gets its hint, read from its type.
    with pytest.raises(TypeError, match="pass its primary key and load it in the job"):
        jobs.add.perform_later_many([{"a": n} for n in range(1500)] + [{"a": Job(name="x")}])


def test_a_post_init_receiver_that_queries_sees_each_copied_job_after_the_copy():
    # Jobs are built by from_db when someone listens to Job's post_init; a receiver that
    # queries would wait forever on the connection the COPY holds, so they are built after.
    seen, before = [], []

    def receiver(sender, instance, **kwargs):
        if not before:
            before.append(_last_statement())  # what ran before the first receiver's query
        # Queries only once the COPY is over: built inside it, this test fails instead of hanging.
        idle = connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        seen.append((instance.pk, idle and Job.objects.filter(pk=instance.pk).exists()))

    post_init.connect(receiver, sender=Job)
    try:
        created = jobs.add.perform_later_many([{"a": n} for n in range(2500)])
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert before[0].startswith("COPY axa_queue")
    assert [pk for pk, _ in seen] == [job.pk for job in created]
    assert all(found for _, found in seen)  # each row was there when its Job was built
    assert Job.objects.count() == 2500


@pytest.mark.parametrize(
    "job, args",
    [
        (jobs.add, {"a": 1}),
        (jobs.add.using(queue="other", priority=3), {"a": 1}),
        (one_per_account, {"account_id": 1, "token": "t"}),
        (one_per_account.using(concurrency_key="fixed"), {"account_id": 1, "token": "t"}),
        (five_per_second, {"api": "a", "token": "t"}),
    ],
)
def test_a_jobs_fixed_options_are_what_each_call_gets(job, args):
    # perform_later_many streams a batch only when no call's options differ from these.
    fixed = job._fixed_options()
    if fixed is not None:
        assert job._options_for(args) is fixed
    else:
        assert job._options_for(args) != job.options


REFUSE = """
CREATE FUNCTION axa_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.args->>'n' = '2000' THEN RAISE EXCEPTION 'refused row 2000'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER axa_test_refuse BEFORE INSERT ON axa_queue FOR EACH ROW EXECUTE FUNCTION axa_test_refuse();
"""


@override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata")
def test_a_bulk_enqueue_by_copy_reads_its_times_as_the_orm_does_with_use_tz_false():
    created = jobs.add.perform_later_many([{"a": 1}, {"a": 2}])
    assert _last_statement().startswith("COPY axa_queue")
    # The times were filled in by the database: loaded on first access, naive, in TIME_ZONE.
    local_now = datetime.datetime.now(zoneinfo.ZoneInfo("Asia/Kolkata")).replace(tzinfo=None)
    for job in created:
        assert job.run_at.tzinfo is None and job.run_at == Job.objects.get(pk=job.pk).run_at
        assert abs(job.created_at - local_now) < datetime.timedelta(minutes=1)
