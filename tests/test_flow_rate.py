"""Rate limits: at most N starts per period and key across the fleet, held-back jobs woken at the next token."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from axa_django import Job, background_job
from axa_django.enqueuing.flow import Rate, parse_rate
from axa_django.models import RateBucket
from axa_django.worker import Worker
from tests.conftest import AXA_APPS, wait_for
from tests.testapp import flow_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def starts(log: Path) -> dict[str, list[float]]:
    found: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text().splitlines():
        key, _, at = line.split(" ")
        found[key].append(float(at))
    return {key: sorted(times) for key, times in found.items()}


def most_in_a_window(times: list[float], period: float) -> int:
    """The most starts in any half-open window [t, t + period)."""
    most = 0
    for index, first in enumerate(times):
        most = max(most, sum(1 for t in times[index:] if t < first + period))
    return most


@pytest.mark.halved
def test_four_workers_never_start_more_than_n_per_window_and_wake_at_the_next_token(workers, tmp_path) -> None:
    log = tmp_path / "log"
    flow_jobs.five_per_second.perform_later_many(
        [{"api": api, "token": f"{api}{i}", "log": str(log)} for api in ("a", "b") for i in range(12)]
    )
    procs = [workers.start("--concurrency", "4", "--poll-interval", "30") for _ in range(4)]
    wait_for(lambda: Job.objects.filter(status="completed").count() == 24, timeout=60, what="every job to run")
    assert {key: len(times) for key, times in starts(log).items()} == {"a": 12, "b": 12}
    # Each start as the claim recorded it, on the database's clock (the clock the limit keeps).
    found: dict[str, list[float]] = defaultdict(list)
    for job in Job.objects.all():
        found[job.args["api"]].append(job.started_at.timestamp())
    found = {key: sorted(times) for key, times in found.items()}
    assert all(most_in_a_window(times, 1.0) <= 5 for times in found.values()), found
    # With a 30 s poll, only the wake-up at each next token can drain 12 starts per key
    # within the deadline above (waiting on polls would take over 5 minutes).
    gaps = [b - a for times in found.values() for a, b in itertools.pairwise(times)]
    assert all(proc.poll() is None for proc in procs)
    print(f"\nrate 5/s, 2 keys, 4 workers: peaks {[most_in_a_window(t, 1.0) for t in found.values()]}")
    print(f"gaps min {min(gaps):.3f}s max {max(gaps):.3f}s")


def test_a_burst_worker_waits_for_tokens_then_drains() -> None:
    jobs = [flow_jobs.five_per_second.perform_later("c", f"c{i}") for i in range(3)]
    worker = Worker(burst=True, install_signals=False, concurrency=2)
    assert worker.run() == 0
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status="completed").count() == 3
    bucket = RateBucket.objects.get(name=flow_jobs.five_per_second.name, key="c")
    assert bucket.tat is not None


def test_rows_carry_their_rate_key() -> None:
    assert flow_jobs.five_per_second.perform_later("x").rate_key == "x"
    assert flow_jobs.two_per_minute.perform_later().rate_key == ""
    assert flow_jobs.five_per_second.using(rate_key="y").perform_later("x").rate_key == "y"


@pytest.mark.parametrize(
    ("text", "rate"), [("10/s", Rate(10, 1.0)), (" 100 / m ", Rate(100, 60.0)), ("1000/hour", Rate(1000, 3600.0))]
)
def test_rates_parse(text: str, rate: Rate) -> None:
    assert parse_rate(text, "j") == rate


@pytest.mark.parametrize("bad", ["10", "10/d", "0/s", "-1/s", "1.5/s", "ten/s", "10/s; DROP", 10, "", "99999999999/s"])
def test_a_rate_that_does_not_parse_is_refused_at_decoration(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="rate"):
        background_job(name="flow.badrate", rate=bad)(flow_jobs.mark)  # type: ignore[call-overload]


def test_bad_rate_keys_and_mixed_limits_are_refused_and_nothing_is_written() -> None:
    with pytest.raises(TypeError, match="give rate"):
        background_job(name="flow.nokey", rate_key=lambda **_: "k")(flow_jobs.mark)
    with pytest.raises(TypeError, match="not supported"):
        background_job(name="flow.both", rate="1/s", concurrency=1)(flow_jobs.mark)
    raises = background_job(name="flow.rraises", rate="1/s", rate_key=lambda **_: {}["x"])(flow_jobs.mark)
    with pytest.raises(ValueError, match="rate_key function raised KeyError"):
        raises.perform_later("p", "t")
    none = background_job(name="flow.rnone", rate="1/s", rate_key=lambda **_: None)(flow_jobs.mark)
    with pytest.raises(TypeError, match="returned None, not a str"):
        none.perform_later("p", "t")
    with pytest.raises(ValueError, match="has no rate limit"):
        flow_jobs.unlimited.using(rate_key="k")
    assert not Job.objects.exists()
