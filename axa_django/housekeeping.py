"""What a worker does besides running jobs: enqueue periodic jobs, prune, relay cancels.

``run(worker)`` is called from the dispatcher's housekeeping; it uses the dispatcher
thread's Django connection, and only when there is something to do, so a worker with
no periodic jobs and no RETENTION opens no extra connection.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from . import conf, cron, pruning

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("axa_django")

CANCEL_CHANNEL = "axa_cancel"
# Rows a worker prunes per housekeeping: small enough not to delay claims noticeably.
RETENTION_BATCH = 2000


def run(worker: Worker) -> None:
    """Enqueue due periodic jobs this worker could run, then prune one batch if RETENTION is set."""
    retention = conf.get("RETENTION")
    names = worker.handler_names()
    if not cron.scheduled_jobs(names, worker.queues) and retention is None:
        return
    try:
        for job in cron.schedule(names=names, queues=worker.queues):
            logger.info("enqueued periodic job %s %s for %s", job.name, job.id, job.unique_key)
        if retention is not None:
            deleted = pruning.prune_batch(
                datetime.timedelta(seconds=retention), batch_size=RETENTION_BATCH, using=worker.using
            )
            if deleted:
                logger.info("pruned %d finished job(s) older than RETENTION", deleted)
    except DatabaseError as error:
        # The next housekeeping tries again, on a new connection if this one broke.
        logger.warning("housekeeping failed (%s); retrying later", error)
        connections[worker.using].close_if_unusable_or_obsolete()
    except Exception:  # scheduling and pruning must never stop the worker
        logger.exception("housekeeping failed; retrying later")


def relay_cancel(worker: Worker, payload: str) -> None:
    """Tell the running job named by a NOTIFY ``axa_cancel`` payload that it was cancelled."""
    try:
        job_id = uuid.UUID(payload)
    except ValueError:
        return
    with worker._lock:
        job = worker._in_flight.get(job_id)
        if job is not None and job.context is not None:
            job.context.cancel()
