"""Ready jobs no live worker handles: names in no live worker's ``names``, backends in none's ``backends``."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from urllib.parse import urlencode

from django.db import connections

from . import conf

# A count stops here: past it the figure only says "many", and counting on would read them all.
COUNT_CAP = 100_000

# Distinct queued names by a loose index scan of axa_queue_claim (name, priority DESC, run_at)
# WHERE status = 'queued': one index probe per name, however many rows each has; rows
# are counted only for the names no live worker claims.
NAMES = """
WITH RECURSIVE queued(name) AS (
    (SELECT name FROM axa_queue WHERE status = 'queued' ORDER BY name LIMIT 1)
    UNION ALL
    SELECT (SELECT q.name FROM axa_queue q WHERE q.status = 'queued' AND q.name > queued.name ORDER BY q.name LIMIT 1)
    FROM queued WHERE queued.name IS NOT NULL
), unhandled AS MATERIALIZED (
    SELECT name FROM queued
    WHERE name IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM axa_worker w WHERE w.heartbeat_at >= now() - %(lease)s AND w.names ? queued.name
    )
)
SELECT u.name, c.ready
FROM unhandled u CROSS JOIN LATERAL (
    SELECT count(*) AS ready FROM (
        SELECT 1 FROM axa_queue q
        WHERE q.status = 'queued' AND q.name = u.name AND q.backend IS NULL AND q.run_at <= now()
        LIMIT %(cap)s
    ) AS capped
) AS c
WHERE c.ready > 0
ORDER BY c.ready DESC, u.name
LIMIT %(limit)s
"""

# The same for django.tasks rows, by backend alias over axa_queue_claim_task (backend, ...).
BACKENDS = """
WITH RECURSIVE queued(backend) AS (
    (SELECT backend FROM axa_queue WHERE status = 'queued' AND backend IS NOT NULL ORDER BY backend LIMIT 1)
    UNION ALL
    SELECT (
        SELECT q.backend FROM axa_queue q
        WHERE q.status = 'queued' AND q.backend IS NOT NULL AND q.backend > queued.backend
        ORDER BY q.backend LIMIT 1
    )
    FROM queued WHERE queued.backend IS NOT NULL
), unhandled AS MATERIALIZED (
    SELECT backend FROM queued
    WHERE backend IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM axa_worker w WHERE w.heartbeat_at >= now() - %(lease)s AND w.backends ? queued.backend
    )
)
SELECT u.backend, c.ready
FROM unhandled u CROSS JOIN LATERAL (
    SELECT count(*) AS ready FROM (
        SELECT 1 FROM axa_queue q
        WHERE q.status = 'queued' AND q.backend = u.backend AND q.run_at <= now()
        LIMIT %(cap)s
    ) AS capped
) AS c
WHERE c.ready > 0
ORDER BY c.ready DESC, u.backend
LIMIT %(limit)s
"""


@dataclass(frozen=True)
class Unhandled:
    """A job name (``kind == "name"``) or task backend alias (``"backend"``) with ready rows no live worker claims."""

    kind: str
    value: str
    ready: int

    @property
    def capped(self) -> bool:
        """Whether ``ready`` stopped at ``COUNT_CAP`` (there are at least that many)."""
        return self.ready >= COUNT_CAP

    @property
    def filter_query(self) -> str:
        """The job list's query string for these rows (the list filters names, not backends)."""
        params = {"status__exact": "queued"}
        if self.kind == "name":
            params["name"] = self.value
        return urlencode(params)


def collect(using: str | None = None, limit: int = 50) -> list[Unhandled]:
    """Names, then backends, with ready rows that no worker whose lease is current handles, most rows first."""
    params = {
        "lease": datetime.timedelta(seconds=float(conf.get("LEASE_SECONDS"))),
        "cap": COUNT_CAP,
        "limit": limit,
    }
    with connections[using or conf.get("DATABASE")].cursor() as cursor:
        cursor.execute(NAMES, params)
        found = [Unhandled("name", name, ready) for name, ready in cursor.fetchall()]
        cursor.execute(BACKENDS, params)
        found += [Unhandled("backend", backend, ready) for backend, ready in cursor.fetchall()]
    return found
