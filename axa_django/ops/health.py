"""Is the queue healthy? The reasons it is not, for ``jobhealth`` (a liveness/readiness probe or cron check).

Also: the worker's ``--health-file`` (touched at each acknowledged heartbeat, for
exec probes that cannot reach the database).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import unhandled
from . import fleetstats


@dataclass
class Report:
    """The figures and every reason the queue is not healthy (none: healthy)."""

    snapshot: fleetstats.Snapshot | None
    reasons: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """No reason found."""
        return not self.reasons

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``healthy``, ``reasons`` and the figures."""
        figures = self.snapshot.as_dict() if self.snapshot is not None else None
        return {"healthy": self.healthy, "reasons": self.reasons, "figures": figures}


def _seconds(value: float) -> str:
    return f"{value:,.1f}s"


def reasons(
    snapshot: fleetstats.Snapshot,
    found_unhandled: list[unhandled.Unhandled],
    *,
    max_ready_age: float | None = None,
    require_workers: int | None = None,
    queues: list[str] | None = None,
) -> list[str]:
    """Why the queue is unhealthy, one line each (names quoted with repr, so nothing in a name can forge a line)."""
    found: list[str] = []
    live = snapshot.live_workers
    if queues is not None:
        live = [w for w in live if any(w.covers(queue) for queue in queues)]
    if require_workers is not None and len(live) < require_workers:
        where = f" for queue(s) {', '.join(map(repr, queues))}" if queues else ""
        found.append(f"{len(live)} live worker(s){where}, fewer than --require-workers {require_workers}")
    for stats in snapshot.queues:
        count = f"{'at least ' if stats.ready_capped else ''}{stats.ready:,}"
        if stats.ready and not any(w.covers(stats.queue) for w in snapshot.live_workers):
            found.append(f"queue {stats.queue!r}: {count} ready job(s) and no live worker claims from this queue")
        age = stats.oldest_ready_seconds
        if max_ready_age is not None and age is not None and age > max_ready_age:
            found.append(
                f"queue {stats.queue!r}: the oldest ready job has waited {_seconds(age)}, "
                f"longer than --max-ready-age {max_ready_age:g}s ({count} ready)"
            )
    beat = snapshot.lease / 3
    for worker in snapshot.workers:
        if queues is not None and not any(worker.covers(queue) for queue in queues):
            continue
        if worker.late:
            state = "its lease has expired" if not worker.alive else f"presumed dead after {snapshot.lease:g}s"
            found.append(
                f"worker {worker.id} on host {worker.hostname!r} (pid {worker.pid}): last heartbeat "
                f"{_seconds(worker.heartbeat_age)} ago, late (it beats every {beat:g}s; {state})"
            )
    uncovered = {
        stats.queue for stats in snapshot.queues if not any(w.covers(stats.queue) for w in snapshot.live_workers)
    }
    for entry in found_unhandled:
        if queues is not None and entry.queue not in queues:
            continue
        if entry.queue in uncovered:
            continue  # already said: no live worker claims from this queue at all
        count = f"at least {entry.ready:,}" if entry.ready >= unhandled.CAP else f"{entry.ready:,}"
        found.append(f"{entry.describe()}: {count} ready and no live worker claims them")
    return found


def check(
    *,
    using: str | None = None,
    max_ready_age: float | None = None,
    require_workers: int | None = None,
    queues: list[str] | None = None,
) -> Report:
    """Read the figures and judge them."""
    snapshot = fleetstats.collect(using, queues)
    found_unhandled = unhandled.find(using)
    return Report(
        snapshot,
        reasons(snapshot, found_unhandled, max_ready_age=max_ready_age, require_workers=require_workers, queues=queues),
    )


def check_health_file(path: str) -> str:
    """``path`` as given, if a worker can touch it there; ValueError saying why not."""
    target = Path(path)
    if not path or path.endswith(os.sep):
        raise ValueError(f"--health-file needs a file path, got {path!r}")
    if target.is_dir():
        raise ValueError(f"--health-file {path!r} is a directory; give a file path inside it")
    parent = target.parent
    if not parent.is_dir():
        raise ValueError(f"--health-file {path!r}: directory {str(parent)!r} does not exist; create it first")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"--health-file {path!r} is not writable by this process")
    return path


def touch(path: str | None) -> None:
    """Set ``path``'s modification time to now, creating it if needed (OSError if the disk refuses)."""
    if path is None:
        return
    with open(path, "a"):
        pass
    os.utime(path)
