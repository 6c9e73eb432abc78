"""A worker's options, checked once as it is built and frozen from then on."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import uuid
from collections.abc import Iterable
from typing import Any

from .. import conf, registry
from ..selection import check_names, check_queue, task_backend_aliases

# Rows claimed ahead of free threads, unless ``prefetch`` says otherwise. Only jobs much
# shorter than the dispatcher's round trip reach it (the dispatcher holds about 20 ms of
# work ahead): a claim serves up to this many of them. The dispatcher's claims are a
# drain's limit while the cap binds: 30,000 no-op jobs, one worker process, medians of 4
# interleaved drains, ran at 13,890 jobs/s at 256 rows, 17,330 at 1,024 and 18,456 at
# 2,048, and the database's CPU per job fell from 0.054 to 0.032 ms
# (benchmarks/results/pg15-prefetch-sweep.txt).
DEFAULT_PREFETCH = 2048


@dataclasses.dataclass(frozen=True)
class Options:
    """What a worker runs and how; built by ``Options.build``, which says what is wrong with a value."""

    concurrency: int
    prefetch: int  # at most this many rows claimed and not yet started (0: claim for free threads only)
    poll_interval: float
    burst: bool
    max_jobs: int | None
    queues: list[str] | None
    names: list[str] | None
    # django.tasks rows are claimed by backend alias; --job names only background jobs.
    backends: list[str]
    grace_period: float | None
    using: str
    install_signals: bool
    log_attempts: bool
    timeout_grace: float
    health_file: str | None  # touched at start and at each acknowledged heartbeat
    lease: float
    stale_minutes: int
    pooling: bool
    notify: bool  # as configured; the listener may fall back to polling (Listener.enabled)

    @classmethod
    def build(
        cls,
        *,
        concurrency: int = 4,
        poll_interval: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        queues: Iterable[str] | None = None,
        names: Iterable[str] | None = None,
        grace_period: float | None = None,
        using: str | None = None,
        install_signals: bool = True,
        log_attempts: bool = False,
        timeout_grace: float = 5.0,
        prefetch: int | None = None,
        health_file: str | None = None,
    ) -> Options:
        """Check each value (ValueError naming the option) and read the settings the worker needs."""
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be a positive whole number, not {concurrency!r}")
        if poll_interval is not None and not (isinstance(poll_interval, int | float) and poll_interval > 0):
            raise ValueError(f"poll_interval must be a positive number of seconds, not {poll_interval!r}")
        if max_jobs is not None and (type(max_jobs) is not int or max_jobs < 1):
            raise ValueError(f"max_jobs must be a positive whole number, not {max_jobs!r}")
        if grace_period is not None and not (isinstance(grace_period, int | float) and grace_period >= 0):
            raise ValueError(f"grace_period must be a number of seconds >= 0, not {grace_period!r}")
        if prefetch is not None and (type(prefetch) is not int or prefetch < 0):
            raise ValueError(f"prefetch must be a whole number >= 0, not {prefetch!r}")
        if not (isinstance(timeout_grace, int | float) and not isinstance(timeout_grace, bool) and timeout_grace >= 0):
            raise ValueError(f"timeout_grace must be a number of seconds >= 0, not {timeout_grace!r}")
        pooling = bool(conf.get("TRANSACTION_POOLING"))
        return cls(
            concurrency=concurrency,
            prefetch=DEFAULT_PREFETCH if prefetch is None else prefetch,
            poll_interval=float(poll_interval or conf.get("POLL_INTERVAL")),
            burst=burst,
            max_jobs=max_jobs,
            queues=sorted({check_queue(queue) for queue in queues}) if queues else None,
            names=check_names(names) if names is not None else None,
            backends=task_backend_aliases() if names is None else [],
            grace_period=grace_period,
            using=using or conf.get("DATABASE"),
            install_signals=install_signals,
            log_attempts=log_attempts,
            timeout_grace=float(timeout_grace),
            health_file=health_file,
            lease=float(conf.get("LEASE_SECONDS")),
            stale_minutes=int(conf.get("STALE_MINUTES")),
            pooling=pooling,
            notify=bool(conf.get("NOTIFY")) and not pooling,
        )

    @property
    def housekeeping_interval(self) -> float:
        """Seconds between rescues (and heartbeats): a third of the lease."""
        return max(0.05, self.lease / 3)

    def handler_names(self) -> list[str]:
        """Names of jobs this worker claims."""
        names = sorted(registry.registry) if self.names is None else self.names
        return [name for name in names if name in registry.registry]

    def registration(self, worker_id: uuid.UUID) -> dict[str, Any]:
        """The parameters of sql.REGISTER for this worker."""
        return {
            "worker": worker_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.concurrency,
            "queues": json.dumps(self.queues or []),
            "names": json.dumps(self.handler_names()),
            "backends": json.dumps(self.backends),
            "lease": self.lease,
        }
