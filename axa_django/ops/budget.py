"""Connections: how many a worker holds, and whether the fleet's total fits the server's max_connections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connections

from .. import conf

# The worker's own connections: dispatcher, heartbeat, finisher, and the listener when it listens.
OWN = ("dispatcher", "heartbeat", "finisher", "listener")
# Kept free for web processes, migrations, psql and the admin: a fifth of what the server
# allows, at least this many.
MARGIN_MIN = 5
MARGIN_SHARE = 0.2

# The server's limits and, for live workers, the connections each may hold (own four, one
# per job thread and the dispatcher's Django one: the upper bound, since those connect only
# when jobs use the database).
FLEET = """
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0),
       (SELECT count(*) FROM axa_worker WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)),
       (SELECT coalesce(sum(concurrency + %(own)s), 0) FROM axa_worker
        WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
"""


# Beyond its own and its job threads': the dispatcher thread's Django connection, used by
# periodic jobs and pruning.
EXTRA = 1


def worker_connections(concurrency: int, listens: bool) -> tuple[int, int]:
    """(its own connections, at most this many more: one per job thread and the dispatcher's Django one)."""
    return len(OWN) - (0 if listens else 1), concurrency + EXTRA


def start_line(concurrency: int, listens: bool) -> str:
    """What runworker says at start about the connections it will hold."""
    own, more = worker_connections(concurrency, listens)
    names = ", ".join(OWN if listens else OWN[:-1])
    return (
        f"this worker holds up to {own + more} database connections: {own} of its own ({names}), one per job "
        f"thread ({concurrency}) while its jobs use the database, and {EXTRA} for periodic jobs and pruning; size "
        f"max_connections for every worker (python manage.py check --database {conf.alias_as_written()} warns when "
        "they do not fit)"
    )


@dataclass
class Fleet:
    """The server's connection limits and what the live workers may hold."""

    max_connections: int
    reserved: int
    workers: int
    workers_hold: int
    in_use: int

    @property
    def usable(self) -> int:
        """Connections ordinary roles may open."""
        return self.max_connections - self.reserved

    @property
    def margin(self) -> int:
        """Connections kept for everything that is not a worker."""
        return max(MARGIN_MIN, round(self.usable * MARGIN_SHARE))

    @property
    def tight(self) -> bool:
        """The workers' total plus the margin reaches what the server allows."""
        return self.workers_hold + self.margin >= self.usable


def fleet(alias: str, lease: float) -> Fleet:
    """Read the limits and the live workers' total from ``alias``."""
    with connections[alias].cursor() as cursor:
        cursor.execute(FLEET, {"lease": lease, "own": len(OWN) + EXTRA})
        row: Any = cursor.fetchone()
    max_conn, superuser, reserved, count, hold, in_use = row
    return Fleet(int(max_conn), int(superuser) + int(reserved), int(count), int(hold), int(in_use))


def warning_text(found: Fleet) -> tuple[str, str]:
    """(message, hint) for the system check when ``found`` is tight."""
    message = (
        f"The {found.workers} live worker(s) may hold up to {found.workers_hold} connections (concurrency + "
        f"{len(OWN) + EXTRA} each); with {found.margin} kept for web processes and the rest, that reaches the "
        f"{found.usable} this server allows (max_connections {found.max_connections} minus {found.reserved} "
        f"reserved; {found.in_use} in use now)."
    )
    # Said in full: an installed wheel has no docs/ to point to.
    hint = (
        "Raise max_connections, lower --concurrency or run fewer workers, or put a pooler in front (session mode, "
        "or transaction mode with AXA_DJANGO = {'TRANSACTION_POOLING': True})."
    )
    return message, hint
