"""Every enqueue boundary refuses what PostgreSQL cannot store, before any SQL, with a clear error."""

import datetime
import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from axa_django import Job, background_job, enqueue, enqueue_many
from axa_django.arguments import MAX_DEPTH, check_json, encode
from tests.conftest import wait_for
from tests.testapp import boundary_jobs, jobs

pytestmark = pytest.mark.django_db

ADD = "tests.testapp.jobs.add"


def nested(levels: int, kind: str = "list") -> Any:
    """``levels`` lists (or dicts under key "k") one inside the other, built without recursion."""
    value: Any = 0
    for _ in range(levels):
        value = [value] if kind == "list" else {"k": value}
    return value


def db_now(function: str = "now()") -> datetime.datetime:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}")
        return cursor.fetchone()[0]


# -- NUL and lone surrogates ----------------------------------------------------------

NUL = "contains a NUL character (\\x00), which PostgreSQL cannot store in jsonb"
SURROGATE = "contains the lone surrogate '\\ud800', which is not valid Unicode"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a\x00b", f"argument 'a' of job '{ADD}' {NUL}"),
        ({"k": ["ok", "x\x00"]}, f"argument 'a' of job '{ADD}'['k'][1] {NUL}"),
        ({"k": {"bad\x00key": 1}}, f"argument 'a' of job '{ADD}'['k'] has the key 'bad\\x00key', which {NUL}"),
        ("\ud800", f"argument 'a' of job '{ADD}' {SURROGATE}"),
        ([{"\ud800": 1}], f"argument 'a' of job '{ADD}'[0] has the key '\\ud800', which {SURROGATE}"),
    ],
    ids=["value", "nested", "key", "surrogate", "surrogate-key"],
)
def test_nul_or_a_lone_surrogate_is_refused_by_name_and_the_atomic_block_stays_usable(value, message):
    with transaction.atomic():
        with pytest.raises(ValueError) as raised:
            jobs.add.perform_later(value)
        assert message in str(raised.value)
        # Nothing was sent: the caller's transaction is not aborted.
        assert Job.objects.count() == 0
        jobs.add.perform_later("fine")
    assert Job.objects.count() == 1


def test_nul_is_refused_on_every_enqueue_path():
    with pytest.raises(ValueError, match=r"item 1: argument 'a' of job 'tests.testapp.jobs.add'\['k'\] contains a NUL"):
        jobs.add.perform_later_many([{"a": 1}, {"a": {"k": "\x00"}}])
    with pytest.raises(ValueError, match=r"argument 'note' of job 'billing.Invoice' contains a NUL"):
        enqueue("billing.Invoice", note="\x00")
    with pytest.raises(ValueError, match=r"item 0: argument 'note' of job 'billing.Invoice' contains a NUL"):
        enqueue_many("billing.Invoice", [{"note": "\x00"}])
    assert not Job.objects.exists()


def test_a_literal_backslash_u0000_is_ordinary_text():
    job = jobs.add.perform_later("\\u0000", b={"\\u0000": "\\u0000"})
    assert Job.objects.get(pk=job.pk).args == {"a": "\\u0000", "b": {"\\u0000": "\\u0000"}}


def test_a_nul_in_a_return_value_is_a_value_error_from_encode():
    with pytest.raises(ValueError, match=r"the return value of job 'j'\['k'\] contains a NUL character .* in jsonb"):
        encode({"k": "\x00"}, "the return value of job 'j'", 2**31)


def test_a_job_returning_nul_fails_with_bad_result_and_the_reason():
    with override_settings(AXA_DJANGO={"MODE": "immediate"}):
        job = boundary_jobs.returns_nul.perform_later()
    assert job.status == "failed"
    assert job.errors[-1]["type"] == "axa_django.exceptions.BadResult"
    assert "contains a NUL character (\\x00), which PostgreSQL cannot store in jsonb" in job.error


# -- depth ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_arguments_nested_10000_deep_are_refused_by_name_not_recursion_error(kind):
    deep = nested(10_000, kind)
    message = f"argument 'a' of job '{ADD}' nests lists/dicts more than {MAX_DEPTH} levels deep"
    with pytest.raises(ValueError) as raised:
        jobs.add.perform_later(deep)
    assert message in str(raised.value) and len(str(raised.value)) < 300
    with pytest.raises(ValueError, match=r"argument 'a' of job 'billing.Invoice' nests lists/dicts more than 200"):
        enqueue("billing.Invoice", a=deep)
    with pytest.raises(ValueError, match=r"the return value of job 'j' nests lists/dicts more than 200"):
        encode(deep, "the return value of job 'j'", 2**31)
    with pytest.raises(ValueError, match=r"^x nests lists/dicts more than 200"):
        check_json(deep, "x")
    assert not Job.objects.exists()


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_exactly_max_depth_is_stored_and_read_back(kind):
    assert MAX_DEPTH == 200
    job = jobs.add.perform_later(nested(MAX_DEPTH, kind))
    assert Job.objects.get(pk=job.pk).args == {"a": nested(MAX_DEPTH, kind)}
    with pytest.raises(ValueError, match=r"more than 200 levels deep"):
        jobs.add.perform_later(nested(MAX_DEPTH + 1, kind))


def test_an_integer_python_cannot_print_is_refused_by_name():
    with pytest.raises(ValueError, match=r"argument 'a' of job 'tests.testapp.jobs.add'\[0\] is an integer too large"):
        jobs.add.perform_later([10**5000])


# -- names, queues and keys -----------------------------------------------------------

UNPRINTABLE = ["a\x00b", "a\nb", "a\r", "tab\there", "\x1b[31mred", "del\x7f", "nel\x85", "line\u2028sep", "\udc00"]
ODD_BUT_VALID = ["%(queues)s", "'; DROP TABLE x; --", "{names}", "%s", "a b", "名前.ジョブ", "emoji 🚀"]


@pytest.mark.parametrize("name", UNPRINTABLE)
def test_a_job_name_with_a_control_character_is_refused_at_enqueue_and_decoration(name):
    with pytest.raises(
        ValueError, match=r"job name .* contains the unprintable character .* printable characters only"
    ):
        enqueue(name)
    with pytest.raises(ValueError, match=r"job name .* contains the unprintable character"):
        background_job(name=name)(lambda: None)
    assert not Job.objects.exists()


@pytest.mark.parametrize("name", UNPRINTABLE)
def test_a_queue_name_or_unique_key_with_a_control_character_is_refused(name):
    with pytest.raises(ValueError, match=r"queue name .* contains the unprintable character"):
        jobs.add.using(queue=name)
    with pytest.raises(ValueError, match=r"unique key .* contains the unprintable character"):
        jobs.add.using(unique_key=name)
    with pytest.raises(ValueError, match=r"unique key .* contains the unprintable character"):
        boundary_jobs.keyed.perform_later(name)  # the key comes from unique=...
    with pytest.raises(ValueError, match=r"queue name .* contains the unprintable character"):
        background_job(name="boundary.never_registered", queue=name)(lambda: None)
    assert not Job.objects.exists()


def test_the_message_says_what_and_where():
    with pytest.raises(ValueError) as raised:
        enqueue("send\nmail")
    assert str(raised.value).startswith(
        "job name 'send\\nmail' contains the unprintable character '\\n' (U+000A) at index 4;"
    )


@pytest.mark.parametrize("name", ODD_BUT_VALID)
def test_names_that_look_like_sql_or_format_strings_stay_valid(name):
    job = enqueue(name)  # some of these names are registered (hostile_jobs), without parameters
    keyed = jobs.add.using(queue=name, unique_key=name).perform_later(1)
    assert (Job.objects.get(pk=job.pk).name, Job.objects.get(pk=keyed.pk).queue) == (name, name)
    assert Job.objects.get(pk=keyed.pk).unique_key == name


# -- delay ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_delay_is_added_to_the_database_clock_at_enqueue():
    delay = datetime.timedelta(seconds=5)
    job = jobs.add.using(delay=delay).perform_later(1)
    job.refresh_from_db()
    # created_at and run_at come from the same statement's now().
    assert job.run_at - job.created_at == delay


def test_delay_counts_from_the_enqueue_statement_inside_a_longer_transaction():
    delay = datetime.timedelta(seconds=5)
    started = db_now()  # this test's transaction began here
    wait_for(lambda: db_now("clock_timestamp()") > started, what="the database clock to move")
    job = jobs.add.using(delay=delay).perform_later(1)
    job.refresh_from_db()
    assert job.created_at > started and job.run_at - job.created_at == delay


@pytest.mark.django_db(transaction=True)
def test_a_using_copy_made_earlier_delays_from_the_moment_of_enqueue():
    delay = datetime.timedelta(seconds=5)
    later = jobs.add.using(delay=delay)
    made = db_now("clock_timestamp()")
    wait_for(
        lambda: db_now("clock_timestamp()") > made + datetime.timedelta(seconds=1), what="the database clock to move"
    )
    job = later.perform_later(1)
    job.refresh_from_db()
    assert job.created_at > made + datetime.timedelta(seconds=1)
    assert job.run_at - job.created_at == delay


@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue_with_delay_uses_the_database_clock():
    delay = datetime.timedelta(minutes=3)
    written = jobs.add.using(delay=delay).perform_later_many([{"a": 1}, {"a": 2}])
    assert written.skipped == 0
    for row in Job.objects.filter(pk__in=[job.pk for job in written]):
        assert row.run_at - row.created_at == delay


def test_a_negative_delay_means_now_and_an_absurd_one_is_refused_before_sql():
    job = jobs.add.using(delay=datetime.timedelta(hours=-1)).perform_later(1)
    job.refresh_from_db()
    assert job.run_at == job.created_at
    with pytest.raises(ValueError, match=r"delay must be at most 3650000 days"):
        jobs.add.using(delay=datetime.timedelta.max)
    assert jobs.add.using(delay=datetime.timedelta(days=1)).options.run_at is None  # computed at enqueue


def test_json_of_a_checked_value_is_unchanged():
    value = {"k": [1, 2.5, None, True, "ü"], "n": {"x": []}}
    assert json.loads(encode(value, "v", 1000)) == value
