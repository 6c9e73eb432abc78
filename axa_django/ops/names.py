"""The Job names page's figures: per job name, jobs run, failed and retried, and run times, over the last hour and day.

A page load never reads the day's rows. Finished jobs are counted once per span of time
after it has settled, from the history by an index range on ``finished_at``, into
``axa_name_stat`` (one row per span and name, ``axa_name_span`` marking the span done):
hours for the day (their 23 summed into one row per name once the last is kept, so a
load reads one row per name for them), 5-minute slots for the last hour and the current
hour. Only the slots not kept yet are counted from the rows at each load: the current
one and the one still settling, at most ten minutes of rows.

Run times (``started_at`` to ``finished_at`` of the final attempt) go into a histogram of
log-spaced bins, BINS_PER_DOUBLING per doubling from LOWEST seconds, so the percentiles
of any run of spans come from their summed histograms: each is reported as the middle
(geometric) of the bin holding it, at most ERROR from the exact nearest-rank value.
The longest run is kept exactly.
"""

from __future__ import annotations

import datetime
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections, transaction

from .. import conf
from .dashboard import SETTLE, Hour

logger = logging.getLogger("axa_django")

LOWEST = 0.0001  # seconds: bin 0 holds runs shorter than this (and clocks that went back)
BINS_PER_DOUBLING = 4
TOP_BIN = 120  # holds runs of LOWEST * 2 ** (119 / 4) seconds (25.6 hours) and longer
# Reported as the bin's geometric middle: within this fraction of the exact value.
ERROR = 2 ** (1 / (2 * BINS_PER_DOUBLING)) - 1
DAY_MINUTES = 23 * 60  # a roll-up of the day's kept hours
SLOT_KEPT_FOR = datetime.timedelta(hours=3)  # slots serve the last hour and an hour not kept yet
HOUR_KEPT_FOR = datetime.timedelta(days=7)  # as the dashboard keeps its hours
# The advisory lock of forgetting old spans: one page load at a time forgets, the others go on.
FORGET_LOCK = (0x0A7A0047, 0)

_SECONDS = "date_part('epoch', q.finished_at - q.started_at)"
_BIN = (
    f"CASE WHEN q.started_at IS NULL THEN NULL WHEN {_SECONDS} < {LOWEST!r} THEN 0 "
    f"ELSE least({TOP_BIN}, 1 + floor(ln({_SECONDS} / {LOWEST!r}) * {BINS_PER_DOUBLING / math.log(2)!r}))::smallint END"
)
# A job run more than once: retried after an error, or run again after its worker was lost.
_COUNTS = f"""
    count(*) FILTER (WHERE q.status = 'completed') AS completed,
    count(*) FILTER (WHERE q.status = 'failed') AS failed,
    count(*) FILTER (WHERE q.attempts > 1 OR q.losses > 0) AS retried,
    max({_SECONDS}) AS longest,
    count(q.started_at) AS timed,
    {_BIN} AS bin
"""
# Per (span, name, bin) groups folded into one row per (span, name), the histogram sparse.
_FOLD = """
    sum(c.completed) AS completed, sum(c.failed) AS failed, sum(c.retried) AS retried, max(c.longest) AS longest,
    coalesce(array_agg(c.bin ORDER BY c.bin) FILTER (WHERE c.bin IS NOT NULL), '{}') AS bins,
    coalesce(array_agg(c.timed ORDER BY c.bin) FILTER (WHERE c.bin IS NOT NULL), '{}') AS counts
"""
_CLOCK = """
clock AS (
    SELECT now() AS now, date_trunc('hour', now(), 'UTC') AS hour,
           date_bin('5 minutes', now(), timestamptz '2000-01-01 00:00+00') AS slot
)"""

# The windows: the last hour is the twelve slots up to now, the day the 24 clock hours up to now.
_BOUNDS = """
bounds AS (
    SELECT now, hour, slot, slot - interval '55 minutes' AS hour_from, hour - interval '23 hours' AS day_from FROM clock
)"""
WINDOWS = f"WITH {_CLOCK}, {_BOUNDS} SELECT now, hour_from, day_from FROM bounds"

# Counts each span that settled and is not kept yet, once: the hours of the day, the
# slots of the last two hours. The span is marked first (ON CONFLICT DO NOTHING ...
# RETURNING): of two loads at once, the second waits for the first's mark and counts
# nothing. LATERAL: one index range of axa_queue_finished per span counted, none when
# every span is kept.
KEEP = f"""
WITH {_CLOCK}, due AS (
    SELECT 60 AS minutes, g.start FROM clock c,
        generate_series(c.hour - interval '23 hours', c.hour - interval '1 hour', interval '1 hour') AS g(start)
    WHERE g.start + interval '1 hour' + %(settle)s <= c.now
    UNION ALL
    SELECT 5, g.start
    FROM clock c, generate_series(c.hour - interval '1 hour', c.slot, interval '5 minutes') AS g(start)
    WHERE g.start + interval '5 minutes' + %(settle)s <= c.now
), marked AS (
    INSERT INTO axa_name_span (minutes, start)
    SELECT d.minutes, d.start FROM due d
    WHERE NOT EXISTS (SELECT 1 FROM axa_name_span s WHERE s.minutes = d.minutes AND s.start = d.start)
    ORDER BY d.minutes, d.start
    ON CONFLICT DO NOTHING
    RETURNING minutes, start
)
INSERT INTO axa_name_stat (minutes, start, name, completed, failed, retried, max_seconds, bins, counts)
SELECT m.minutes, m.start, f.*
FROM marked m
CROSS JOIN LATERAL (
    -- Folded span by span: one fold of the whole day's groups sorted them on disk.
    SELECT c.name, {_FOLD}
    FROM (
        SELECT q.name, {_COUNTS}
        FROM axa_queue q
        WHERE q.status IN ('completed', 'failed')
          AND q.finished_at >= m.start AND q.finished_at < m.start + make_interval(mins => m.minutes)
        GROUP BY q.name, bin
    ) AS c
    GROUP BY c.name
) AS f
ON CONFLICT DO NOTHING
"""

# The day's 23 kept hours summed into one row per name (minutes = 1380, from the day's
# first hour), once the last of them is kept: a load then reads one row per name for
# them, not 23. Marked first, as KEEP.
ROLL_UP = f"""
WITH {_CLOCK}, {_BOUNDS}, due AS (
    SELECT b.day_from AS start FROM bounds b
    WHERE b.hour + %(settle)s <= b.now
      AND NOT EXISTS (SELECT 1 FROM axa_name_span s WHERE s.minutes = {DAY_MINUTES} AND s.start = b.day_from)
      AND (SELECT count(*) FROM axa_name_span s
           WHERE s.minutes = 60 AND s.start >= b.day_from AND s.start < b.hour) = 23
), marked AS (
    INSERT INTO axa_name_span (minutes, start) SELECT {DAY_MINUTES}, start FROM due
    ON CONFLICT DO NOTHING
    RETURNING start
), hours AS (
    SELECT t.* FROM marked m
    JOIN axa_name_stat t ON t.minutes = 60 AND t.start >= m.start AND t.start < m.start + interval '23 hours'
), sums AS (
    SELECT h.name, sum(h.completed) AS completed, sum(h.failed) AS failed, sum(h.retried) AS retried,
           max(h.max_seconds) AS longest
    FROM hours h GROUP BY h.name
), binned AS (
    SELECT h.name, u.bin, sum(u.n)::bigint AS n FROM hours h CROSS JOIN LATERAL unnest(h.bins, h.counts) AS u(bin, n)
    GROUP BY h.name, u.bin
), hist AS (
    SELECT b.name, array_agg(b.bin ORDER BY b.bin) AS bins, array_agg(b.n ORDER BY b.bin) AS counts
    FROM binned b GROUP BY b.name
)
INSERT INTO axa_name_stat (minutes, start, name, completed, failed, retried, max_seconds, bins, counts)
SELECT {DAY_MINUTES}, m.start, s.name, s.completed, s.failed, s.retried, s.longest,
       coalesce(h.bins, '{{}}'), coalesce(h.counts, '{{}}')
FROM marked m CROSS JOIN sums s LEFT JOIN hist h ON h.name = s.name
ON CONFLICT DO NOTHING
"""

_OLD = (
    "((s.minutes = 5 AND s.start < now() - %(slots)s) OR (s.minutes = 60 AND s.start < now() - %(hours)s)"
    f" OR (s.minutes = {DAY_MINUTES} AND s.start < now() - %(slots)s - interval '1 day'))"
)
FORGET = f"""
WITH gate AS MATERIALIZED (SELECT pg_try_advisory_xact_lock({FORGET_LOCK[0]}, {FORGET_LOCK[1]}) AS mine),
spans AS (DELETE FROM axa_name_span s USING gate WHERE gate.mine AND {_OLD})
DELETE FROM axa_name_stat s USING gate WHERE gate.mine AND {_OLD}
"""

# The pieces the page adds up, one row per (piece, name): the day's kept hours (their
# roll-up once kept, when %(whole)s allows it); the kept slots of the last hour and of
# the day's hours not kept; and the rest, counted from axa_queue from the first slot
# neither kept nor covered by a kept hour (the current slot and the one settling, once
# the spans are kept). ``grid`` is every slot of the day.
PIECES = f"""
WITH {_CLOCK}, {_BOUNDS}, whole AS MATERIALIZED (
    SELECT %(whole)s AND EXISTS (
        SELECT 1 FROM axa_name_span s, bounds b WHERE s.minutes = {DAY_MINUTES} AND s.start = b.day_from
    ) AS kept
), grid AS MATERIALIZED (
    SELECT g.start, g.start >= b.hour_from AS in_hour,
           (w.kept AND g.start < b.hour) OR EXISTS (
               SELECT 1 FROM axa_name_span s WHERE s.minutes = 60 AND s.start = date_trunc('hour', g.start, 'UTC')
           ) AS hour_kept,
           EXISTS (SELECT 1 FROM axa_name_span s WHERE s.minutes = 5 AND s.start = g.start) AS slot_kept
    FROM bounds b, whole w, generate_series(b.day_from, b.slot, interval '5 minutes') AS g(start)
), live AS (
    SELECT c.slot, c.name, {_FOLD}
    FROM (
        SELECT date_bin('5 minutes', q.finished_at, timestamptz '2000-01-01 00:00+00') AS slot, q.name, {_COUNTS}
        FROM axa_queue q
        WHERE q.status IN ('completed', 'failed')
          AND q.finished_at >= (
              SELECT min(g.start) FROM grid g WHERE NOT g.slot_kept AND (g.in_hour OR NOT g.hour_kept)
          )
          AND q.finished_at < (SELECT slot + interval '5 minutes' FROM bounds)
          AND (%(names)s::text[] IS NULL OR q.name = ANY(%(names)s::text[]))
        GROUP BY 1, 2, bin
    ) AS c
    GROUP BY c.slot, c.name
), pieces AS (
    SELECT t.start AS hour, t.name, true AS in_day, false AS in_hour,
           t.completed, t.failed, t.retried, t.max_seconds AS longest, t.bins, t.counts
    FROM bounds b JOIN whole w ON w.kept
    JOIN axa_name_stat t ON t.minutes = {DAY_MINUTES} AND t.start = b.day_from
    WHERE %(names)s::text[] IS NULL OR t.name = ANY(%(names)s::text[])
    UNION ALL
    SELECT t.start, t.name, true, false, t.completed, t.failed, t.retried, t.max_seconds, t.bins, t.counts
    FROM bounds b JOIN whole w ON NOT w.kept
    JOIN axa_name_stat t ON t.minutes = 60 AND t.start >= b.day_from AND t.start < b.hour
    WHERE %(names)s::text[] IS NULL OR t.name = ANY(%(names)s::text[])
    UNION ALL
    SELECT date_trunc('hour', g.start, 'UTC'), t.name, NOT g.hour_kept, g.in_hour,
           t.completed, t.failed, t.retried, t.max_seconds, t.bins, t.counts
    FROM grid g JOIN axa_name_stat t ON t.minutes = 5 AND t.start = g.start
    WHERE g.slot_kept AND (g.in_hour OR NOT g.hour_kept)
      AND (%(names)s::text[] IS NULL OR t.name = ANY(%(names)s::text[]))
    UNION ALL
    SELECT date_trunc('hour', g.start, 'UTC'), l.name, NOT g.hour_kept, g.in_hour,
           l.completed, l.failed, l.retried, l.longest, l.bins, l.counts
    FROM grid g JOIN live l ON l.slot = g.start
    WHERE NOT g.slot_kept AND (g.in_hour OR NOT g.hour_kept)
)"""

# Per name: the hour's and the day's counts and longest run, and their histograms (the
# bins, then the hour's and the day's counts in each); the percentiles are read in Python.
SUMMARY = f"""
{PIECES}, sums AS (
    SELECT p.name,
           coalesce(sum(p.completed) FILTER (WHERE p.in_hour), 0) AS h_completed,
           coalesce(sum(p.failed) FILTER (WHERE p.in_hour), 0) AS h_failed,
           coalesce(sum(p.retried) FILTER (WHERE p.in_hour), 0) AS h_retried,
           max(p.longest) FILTER (WHERE p.in_hour) AS h_longest,
           coalesce(sum(p.completed) FILTER (WHERE p.in_day), 0) AS d_completed,
           coalesce(sum(p.failed) FILTER (WHERE p.in_day), 0) AS d_failed,
           coalesce(sum(p.retried) FILTER (WHERE p.in_day), 0) AS d_retried,
           max(p.longest) FILTER (WHERE p.in_day) AS d_longest
    FROM pieces p GROUP BY p.name
), binned AS (
    SELECT p.name, u.bin, coalesce(sum(u.n) FILTER (WHERE p.in_hour), 0)::bigint AS h,
           coalesce(sum(u.n) FILTER (WHERE p.in_day), 0)::bigint AS d
    FROM pieces p CROSS JOIN LATERAL unnest(p.bins, p.counts) AS u(bin, n)
    GROUP BY p.name, u.bin
), hist AS (
    SELECT b.name, array_agg(b.bin ORDER BY b.bin) AS bins, array_agg(b.h ORDER BY b.bin) AS h,
           array_agg(b.d ORDER BY b.bin) AS d
    FROM binned b GROUP BY b.name
)
SELECT s.name, s.h_completed, s.h_failed, s.h_retried, s.h_longest,
       s.d_completed, s.d_failed, s.d_retried, s.d_longest, h.bins, h.h, h.d
FROM sums s LEFT JOIN hist h ON h.name = s.name
WHERE s.d_completed + s.d_failed > 0
"""

# Per name of %(names)s and hour of the day (every hour, in order): completed and failed, for the chart.
HOURLY = f"""
{PIECES}, hours AS (
    SELECT g.hour FROM bounds b, generate_series(b.day_from, b.hour, interval '1 hour') AS g(hour)
)
SELECT n.name, h.hour, coalesce(sum(p.completed), 0)::bigint, coalesce(sum(p.failed), 0)::bigint
FROM unnest(%(names)s::text[]) AS n(name) CROSS JOIN hours h
LEFT JOIN pieces p ON p.in_day AND p.name = n.name AND p.hour = h.hour
GROUP BY n.name, h.hour
ORDER BY n.name, h.hour
"""


def estimate(bin_: int | None, longest: float | None) -> float | None:
    """The run time a percentile's bin stands for: its geometric middle, never above the longest run."""
    if bin_ is None or longest is None:
        return None
    if bin_ <= 0:
        value = LOWEST / 2
    elif bin_ >= TOP_BIN:
        value = longest
    else:
        value = LOWEST * 2 ** ((bin_ - 0.5) / BINS_PER_DOUBLING)
    return min(value, longest)


def bin_of(seconds: float) -> int:
    """The bin a run of ``seconds`` falls in (as the SQL computes it)."""
    if seconds < LOWEST:
        return 0
    return min(TOP_BIN, 1 + math.floor(math.log(seconds / LOWEST) * BINS_PER_DOUBLING / math.log(2)))


@dataclass
class Window:
    """One name's figures over one window (the last hour, or the last day)."""

    completed: int = 0
    failed: int = 0
    retried: int = 0
    p50: float | None = None
    p95: float | None = None
    longest: float | None = None

    @property
    def run(self) -> int:
        """Jobs that finished, completed or failed."""
        return self.completed + self.failed


@dataclass
class NameFigures:
    """A job name's figures over the last hour and the last day, and its finished jobs per hour."""

    name: str
    hour: Window
    day: Window
    hours: list[Hour] = field(default_factory=list)


@dataclass
class Figures:
    """Every name's figures, read at one moment of the database clock."""

    now: datetime.datetime
    hour_from: datetime.datetime
    day_from: datetime.datetime
    names: list[NameFigures]


def percentile_bin(bins: list[int], counts: list[int], percent: int) -> int | None:
    """The bin holding the nearest-rank ``percent``-th percentile (as SQL's percentile_disc picks it)."""
    total = sum(counts)
    if not total:
        return None
    rank = -(-percent * int(total) // 100)  # ceil, in integers
    upto = 0
    for bin_, count in zip(bins, counts, strict=True):
        upto += count
        if upto >= rank:
            return bin_
    return None


def _window(counts: tuple[Any, ...], bins: list[int], in_bins: list[int]) -> Window:
    completed, failed, retried, longest = counts
    return Window(
        int(completed),
        int(failed),
        int(retried),
        estimate(percentile_bin(bins, in_bins, 50), longest),
        estimate(percentile_bin(bins, in_bins, 95), longest),
        longest,
    )


def collect(names: list[str] | None = None, *, hourly: bool = False, using: str | None = None) -> Figures:
    """Every name's figures (or only ``names``'), keeping the spans that settled; with ``hourly``, jobs per hour."""
    using = using or conf.get("DATABASE")
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        # As the dashboard: JIT compiled a millisecond statement for a quarter of a second.
        cursor.execute("SELECT set_config('jit', 'off', true)")
        _keep(cursor, using)
        cursor.execute(WINDOWS)
        now, hour_from, day_from = cursor.fetchone()
        cursor.execute(SUMMARY, {"names": names, "whole": True})
        found = [
            NameFigures(
                row[0], _window(row[1:5], row[9] or [], row[10] or []), _window(row[5:9], row[9] or [], row[11] or [])
            )
            for row in cursor.fetchall()
        ]
        if hourly:
            # Hour by hour: the kept hours themselves, not their roll-up.
            cursor.execute(HOURLY, {"names": [f.name for f in found], "whole": False})
            per_name: dict[str, list[Hour]] = {}
            for name, hour, completed, failed in cursor.fetchall():
                per_name.setdefault(name, []).append(Hour(hour, completed, failed))
            for figures in found:
                figures.hours = per_name.get(figures.name, [])
    return Figures(now, hour_from, day_from, found)


_KEEP_REFUSED: set[str] = set()  # aliases whose refusal was logged (a read-only user is refused at every load)


def _keep(cursor: Any, using: str) -> None:
    # In a savepoint, as the dashboard's hours: a user that may not write costs the page
    # its shortcut (every piece counted from the rows), never the page.
    try:
        with transaction.atomic(using=using):
            cursor.execute(FORGET, {"slots": SLOT_KEPT_FOR, "hours": HOUR_KEPT_FOR})
            cursor.execute(KEEP, {"settle": SETTLE})
            cursor.execute(ROLL_UP, {"settle": SETTLE})
    except DatabaseError as error:
        level = logging.DEBUG if using in _KEEP_REFUSED else logging.WARNING
        _KEEP_REFUSED.add(using)
        logger.log(level, "the Job names page could not keep its past spans (it counts them each time): %s", error)
