import os

from axa_django import background_job
from benchmarks.measure import record as write
from benchmarks.peers.base import spread_names


@background_job
def noop() -> None:
    """Does nothing: the benchmarks measure the queue, not the job."""


@background_job
def record(i: int) -> None:
    """Appends its id and times to BENCH_RECORD: the benchmark's drain and pickup runs time these."""
    write(i)


def _record(i: int) -> None:
    """As ``record``, under one of the names a --shapes names:N drain spreads its jobs over."""
    write(i)


def _spread() -> None:
    """Do nothing, under one of BENCH_SPREAD_NAMES names (benchmarks/spread.py)."""


# benchmarks/spread.py's workers serve this many more no-op names: bench.spread0, bench.spread1, ...
for _i in range(int(os.environ.get("BENCH_SPREAD_NAMES", "0"))):
    background_job(name=f"bench.spread{_i}")(_spread)


# benchmarks/run.py --shapes names:N: the drain's jobs spread over N names, bench.record0, ...
for _i in range(spread_names()):
    background_job(name=f"bench.record{_i}")(_record)
