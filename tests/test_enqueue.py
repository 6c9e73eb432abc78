"""Enqueueing: binding, strict JSON, transactions, immediate mode."""

import datetime
import decimal
import math
import uuid

import pytest
from django.db import transaction
from django.test import override_settings

from axa_django import Job, enqueue, enqueue_many
from tests.testapp import jobs

pytestmark = pytest.mark.django_db


class Thing:
    pass


def test_perform_later_writes_a_queued_row_with_bound_args():
    job = jobs.add.perform_later(2, b=3)
    assert isinstance(job, Job)
    row = Job.objects.get(pk=job.pk)
    assert (row.name, row.status, row.args) == ("tests.testapp.jobs.add", "queued", {"a": 2, "b": 3})
    assert row.run_at is not None and row.created_at is not None
    assert row.queue == "default" and row.priority == 0 and row.attempts == 0


def test_defaults_are_not_stored_unless_passed():
    job = jobs.add.perform_later(a=1)
    assert job.args == {"a": 1}


def test_explicit_name_is_used():
    assert jobs.count.name == "CountWorker"
    assert jobs.count.perform_later(fail=False).name == "CountWorker"


def test_enqueue_by_name_for_a_job_this_process_does_not_define():
    job = enqueue("billing.Invoice", customer=7, lines=[{"sku": "a", "qty": 2}])
    assert Job.objects.get(pk=job.pk).args == {"customer": 7, "lines": [{"sku": "a", "qty": 2}]}


def test_enqueue_by_name_of_a_local_job_checks_its_signature():
    with pytest.raises(TypeError, match="CountWorker"):
        enqueue("CountWorker", fale=True)
    assert not Job.objects.exists()


def test_rollback_leaves_no_row():
    with pytest.raises(RuntimeError), transaction.atomic():
        jobs.add.perform_later(1)
        assert Job.objects.count() == 1
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


def test_commit_keeps_the_row_with_the_callers_data():
    with transaction.atomic():
        job = jobs.add.perform_later(1)
    assert Job.objects.filter(pk=job.pk).exists()


# (call arguments, exception type, text the message must contain)
BAD_CALLS = [
    ((), {"a": math.nan}, ValueError, "argument 'a' of job 'tests.testapp.jobs.add' is nan"),
    ((), {"a": math.inf}, ValueError, "argument 'a' of job 'tests.testapp.jobs.add' is inf"),
    ((), {"a": -math.inf}, ValueError, "is -inf, which JSON cannot hold"),
    ((), {"a": b"x"}, TypeError, "argument 'a' of job 'tests.testapp.jobs.add' is a bytes, which is not JSON"),
    ((), {"a": bytearray(b"x")}, TypeError, "is a bytearray, which is not JSON; decode it"),
    (
        (),
        {"a": datetime.datetime(2026, 1, 1)},
        TypeError,
        "is a datetime.datetime, which is not JSON; pass value.isoformat()",
    ),
    ((), {"a": datetime.date(2026, 1, 1)}, TypeError, "is a datetime.date, which is not JSON"),
    ((), {"a": decimal.Decimal("1.5")}, TypeError, "is a decimal.Decimal, which is not JSON"),
    ((), {"a": uuid.UUID(int=1)}, TypeError, "is a uuid.UUID, which is not JSON"),
    ((), {"a": {1, 2}}, TypeError, "is a set, which is not JSON; pass a sorted list"),
    ((), {"a": frozenset()}, TypeError, "is a frozenset, which is not JSON"),
    ((), {"a": (1, 2)}, TypeError, "is a tuple, which is not JSON; pass a list"),
    ((), {"a": {1: "x"}}, TypeError, "argument 'a' of job 'tests.testapp.jobs.add' has the key 1 of type int"),
    (
        (),
        {"a": {"k": [1, {"deep": math.nan}]}},
        ValueError,
        "argument 'a' of job 'tests.testapp.jobs.add'['k'][1]['deep'] is nan",
    ),
    ((), {"a": {"k": Thing()}}, TypeError, "['k'] is a tests.test_enqueue.Thing, which is not JSON"),
    ((), {"a": 1 + 2j}, TypeError, "is a complex, which is not JSON"),
    ((), {}, TypeError, "job 'tests.testapp.jobs.add': missing a required argument: 'a'"),
    ((), {"a": 1, "c": 2}, TypeError, "job 'tests.testapp.jobs.add': unexpected argument 'c'; its parameters are a, b"),
    ((1, 2, 3), {}, TypeError, "job 'tests.testapp.jobs.add': too many positional arguments"),
    ((1,), {"a": 1}, TypeError, "job 'tests.testapp.jobs.add': multiple values for argument 'a'"),
]


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), BAD_CALLS)
def test_bad_arguments_raise_and_write_nothing(args, kwargs, error, message):
    with pytest.raises(error) as raised:
        jobs.add.perform_later(*args, **kwargs)
    assert message in str(raised.value)
    assert not Job.objects.exists()


def test_value_over_the_size_limit_is_refused():
    with override_settings(AXA_DJANGO={"MAX_ARGS_BYTES": 100}), pytest.raises(ValueError) as raised:
        jobs.add.perform_later("x" * 200)
    assert (
        "the arguments of job 'tests.testapp.jobs.add': 208 bytes as JSON, over the limit of 100 (AXA_DJANGO['MAX_ARGS_BYTES'])"
        in str(raised.value)
    )
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("", ValueError, "job name must not be empty"),
        ("   ", ValueError, "job name must not be empty"),
        ("x" * 201, ValueError, "job name is 201 characters long; the limit is 200"),
        (42, TypeError, "job name must be a str, not int"),
    ],
)
def test_enqueue_refuses_bad_names(name, error, message):
    with pytest.raises(error, match=message):
        enqueue(name)
    assert not Job.objects.exists()


def test_bulk_enqueue_writes_every_row_in_one_statement(django_assert_num_queries):
    with django_assert_num_queries(1):
        created = jobs.add.perform_later_many([{"a": i} for i in range(500)] + [((1,), {"b": 2})])
    assert len(created) == 501 and created.skipped == 0
    assert Job.objects.count() == 501
    assert Job.objects.get(pk=created[-1].pk).args == {"a": 1, "b": 2}
    assert created[0].status == "queued" and created[0].run_at is not None  # deferred, loaded on access


def test_bulk_enqueue_rejects_the_whole_batch_naming_the_bad_item():
    with pytest.raises(ValueError, match=r"item 2: argument 'a' of job 'tests.testapp.jobs.add' is nan"):
        jobs.add.perform_later_many([{"a": 1}, {"a": 2}, {"a": math.nan}])
    with pytest.raises(TypeError, match=r"item 1: argument 'x' of job 'other.Job' is a set"):
        enqueue_many("other.Job", [{"x": 1}, {"x": {1}}])
    assert not Job.objects.exists()


def test_single_enqueue_is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        jobs.add.perform_later(1)


@override_settings(AXA_DJANGO={"MODE": "immediate"})
def test_immediate_mode_runs_inline_and_records_the_outcome():
    job = jobs.add.perform_later(2, 5)
    assert job.status == "completed" and job.result == 7 and job.attempts == 1
    failed = jobs.count.perform_later(fail=True)
    assert failed.status == "failed"
    assert "RuntimeError: told to fail" in failed.error
    assert Job.objects.get(pk=failed.pk).status == "failed"


def test_perform_now_returns_the_value_and_writes_nothing():
    assert jobs.add.perform_now(2, b=2) == 4
    assert jobs.add(1, 1) == 2
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 2**31}, "priority must be an int between"),
        ({"priority": True}, "priority must be an int between"),
        ({"max_attempts": 2**31}, "max_attempts must be a positive int below 2147483648, not 2147483648"),
        ({"max_attempts": 0}, "max_attempts must be a positive int"),
        ({"max_losses": 2**31}, "max_losses must be a positive int"),
    ],
)
def test_an_option_the_column_cannot_hold_is_refused_before_any_sql(options, message, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ValueError, match=message):
        jobs.add.using(**options).perform_later_many([{"a": 1}])
    assert not Job.objects.exists()
