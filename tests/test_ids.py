"""Job ids are version 7 UUIDs: they begin with the time they were made, ascend within a batch, and behave as any UUID."""

import copy
import datetime
import pickle
import time
import uuid

import pytest

from axa_django import workflow
from axa_django.ids import uuid7, uuid7s
from axa_django.models import Job, Workflow
from tests.testapp import jobs


def _millisecond(made: uuid.UUID) -> int:
    return made.int >> 80


def _past(made: uuid.UUID) -> None:
    """Return once the clock has left ``made``'s millisecond (a deadline of 5 s)."""
    deadline = time.monotonic() + 5
    while time.time_ns() // 1_000_000 <= _millisecond(made) and time.monotonic() < deadline:
        pass


def test_ids_made_in_bulk_are_distinct_ascending_version_7_uuids_that_behave_as_any_uuid():
    before = time.time_ns() // 1_000_000
    ids = uuid7s(20_000)
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 20_000 and ids == sorted(ids)
    assert all(type(i) is uuid.UUID and i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert all(before <= _millisecond(i) <= after for i in ids)
    for made in ids[:50]:
        parsed = uuid.UUID(str(made))
        assert parsed == made and hash(parsed) == hash(made) and parsed.hex == made.hex
        assert made.is_safe is uuid.SafeUUID.unknown
        assert pickle.loads(pickle.dumps(made)) == made == copy.deepcopy(made)
    assert uuid7s(0) == []


def test_the_bits_after_the_time_start_at_random():
    starts = [uuid7s(1)[0].int & ((1 << 76) - 1) for _ in range(2_000)]
    assert len(set(starts)) == 2_000
    # Bits of the count's random start (below the version): each set in about half of them.
    for bit in (0, 30, 61, 64, 70, 74):
        assert 800 < sum(1 for s in starts if s >> bit & 1) < 1_200, bit
    assert all(s >> 75 == 0 for s in starts)  # the top bit stays clear: a count never reaches the version


def test_ids_made_later_sort_later():
    first = uuid7()
    _past(first)
    assert uuid7() > first


@pytest.mark.django_db(transaction=True)
def test_every_way_to_write_a_job_gives_it_a_version_7_id():
    single = jobs.add.perform_later(1, 2)
    many = jobs.add.perform_later_many([((i, i), {}) for i in range(3)])
    with workflow("w") as w:
        first = w.add(jobs.add, 1, 1)
        w.add(jobs.add, 2, 2, after=[first])
    made = [single, *many, *w.jobs, Job(name="x")]
    assert all(job.pk.version == 7 for job in made), [job.pk for job in made]
    assert list(many) == sorted(many, key=lambda job: job.pk)
    assert {job.pk for job in Job.objects.all()} >= {single.pk, *(job.pk for job in many), *(j.pk for j in w.jobs)}
    assert w.id.version == 7 and Workflow().pk.version == 7


def test_ids_made_after_a_batchs_last_go_on_from_it():
    first = uuid7s(3)
    _past(first[-1])
    more = uuid7s(3, after=first[-1])
    assert first + more == sorted(first + more) and more[0].int == first[-1].int + 1
    assert {_millisecond(i) for i in more} == {_millisecond(first[-1])}
    # At the top of the count, a new start: never a carry into the version or the time.
    top = uuid.UUID(int=first[-1].int | (0xFFF << 64) | ((1 << 62) - 1))
    assert all(i.version == 7 for i in uuid7s(2, after=top))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("options", [{}, {"delay": datetime.timedelta(0)}], ids=["copied", "inserted"])
def test_a_bulk_enqueues_ids_ascend_across_its_parts(options):
    calls = [((i, i), {}) for i in range(2_500)]  # three parts of a COPY
    many = (jobs.add.using(**options) if options else jobs.add).perform_later_many(calls)
    ids = [job.pk for job in many]
    assert len(set(ids)) == 2_500 and ids == sorted(ids)
    assert sorted(Job.objects.values_list("pk", flat=True)) == ids
