"""The worker: claims jobs in batches, hands them to threads, writes outcomes, stays alive.

``Worker`` builds its parts, starts them and stops them in order; each part owns its
state and, where it has one, its connection:

- ``options``: what it runs, checked once and frozen; ``control``: stop, abort, wake,
  and the threads it started (one dying ends the process with exit code 1, so that a
  process manager restarts it instead of keeping a worker that heartbeats but does no
  work); ``ledger``: the jobs held, from claim to written outcome.
- On the main thread, ``dispatcher`` (the loop, the rescue) with ``claimer`` and
  ``limited`` (the claims), on the dispatcher's connection (``connection``).
- On threads of their own: ``jobs`` (``concurrency`` threads running attempts; a job
  opens a Django connection only if its code uses the database), ``finisher`` (writes
  outcomes), ``heartbeat`` (the lease), ``listener`` (LISTEN), ``watchdog`` (timeouts),
  and ``maintenance`` (periodic jobs, retention), each with its own connection.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

from django.db import connections

from .. import registry, sql, unhandled
from ..exceptions import CannotConnect, NotMigrated, PoolerMisconfigured, UnknownJobs
from ..execution import Claimed, NoHandler, Outcome, perform
from ..selection import task_backend_aliases
from .claimer import Claimer
from .connection import DispatcherConnection, connect, keepalives
from .control import STUCK, Control
from .dispatcher import Dispatcher
from .finisher import Finisher, unstorable
from .heartbeat import Heartbeat
from .jobs import JobThreads
from .lanes import Lanes
from .ledger import Ledger
from .limited import LimitedClaims
from .listener import Listener
from .logs import plural, summary
from .lookout import Lookout
from .maintenance import Maintenance
from .options import Options
from .quiet import Quiet
from .signalling import Signals
from .startup import check_notify, check_pooler, check_tables
from .watchdog import Watchdog
from .watchman import Watchman

__all__ = [
    "CannotConnect",
    "Claimed",
    "NoHandler",
    "NotMigrated",
    "Outcome",
    "PoolerMisconfigured",
    "UnknownJobs",
    "Worker",
    "connect",
    "keepalives",
    "perform",
    "task_backend_aliases",
    "unstorable",
]

logger = logging.getLogger("axa_django")


class Worker:
    """Runs jobs until stopped; ``run()`` returns the process exit code."""

    def __init__(
        self,
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
    ) -> None:
        self.options = options = Options.build(
            concurrency=concurrency,
            poll_interval=poll_interval,
            burst=burst,
            max_jobs=max_jobs,
            queues=queues,
            names=names,
            grace_period=grace_period,
            using=using,
            install_signals=install_signals,
            log_attempts=log_attempts,
            timeout_grace=timeout_grace,
            prefetch=prefetch,
            health_file=health_file,
        )
        self.id = worker_id = uuid.uuid4()
        self.control = control = Control(options.grace_period)
        self.ledger = ledger = Ledger()
        self.db = db = DispatcherConnection(options, control, ledger)
        quiet = Quiet()
        lanes = Lanes(notified=options.notify)  # where the plain claim walks from, per priority
        self.listener = Listener(options, worker_id, control, ledger, lanes, quiet)
        self.limited = limited = LimitedClaims(options, worker_id, db, quiet)
        self.jobs = JobThreads(options, worker_id, control, ledger)
        self.watchdog = Watchdog(options, worker_id, control, ledger, self.jobs.replace)
        self.claimer = Claimer(options, worker_id, db, ledger, lanes, quiet, limited, self.watchdog)
        self.watchman = watchman = Watchman(options, worker_id, ledger)
        self.dispatcher = Dispatcher(options, worker_id, control, ledger, db, self.claimer, limited, quiet, watchman)
        self.finisher = Finisher(options, worker_id, control, ledger, limited, self.listener, quiet)
        lookout = Lookout(options, lanes, options.housekeeping_interval, rouse=lambda: _rouse(quiet, control))
        # What a stop asked from the admin (the Workers page) does; per-queue pools stop their whole process.
        self.on_stop_request: Callable[[], None] = control.stop
        # A burst worker's dispatcher keeps the watchman's work (it may be gone before a beat).
        self.heartbeat = Heartbeat(
            options,
            worker_id,
            control,
            ledger,
            lookout,
            None if options.burst else watchman,
            quiet,
            on_stop_request=lambda: self.on_stop_request(),
        )
        self.signals = Signals(control)

    # -- what callers read -----------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Job threads."""
        return self.options.concurrency

    @property
    def queues(self) -> list[str] | None:
        """The queues claimed from (None: all)."""
        return self.options.queues

    @property
    def names(self) -> list[str] | None:
        """The job names claimed (None: every registered job)."""
        return self.options.names

    @property
    def using(self) -> str:
        """The database alias of the queue."""
        return self.options.using

    @property
    def burst(self) -> bool:
        """Whether the worker stops once no job is ready."""
        return self.options.burst

    @property
    def notify(self) -> bool:
        """Whether the worker listens for notifications (False: it polls)."""
        return self.listener.enabled

    @property
    def processed(self) -> int:
        """Attempts finished, retries included."""
        return self.ledger.processed

    @property
    def outcomes(self) -> Counter[str]:
        """Attempts finished, by status."""
        return self.ledger.counts

    def handler_names(self) -> list[str]:
        """Names of jobs this worker claims."""
        return self.options.handler_names()

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; jobs in progress finish, then run() returns 0 (1 if the grace period ran out)."""
        self.control.stop()

    def abort(self) -> None:
        """Stop now: give in-progress jobs back to the queue; run() returns 1."""
        self.control.abort()

    # -- running ---------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or drained with burst); return the exit code."""
        with self.signals.installed(self.options.install_signals):
            return self._run()

    def _run(self) -> int:
        options, control, db = self.options, self.control, self.db
        names = options.handler_names()
        if not db.open_first():
            logger.info("worker %s stopped after 0 attempts: it never reached the database", self.id)
            return 1 if control.aborting.is_set() else 0
        settings = connections[options.using].settings_dict
        logger.info(
            "worker %s starting: concurrency %d, %s (%s), task backends %s, queues %s, database %s on %s",
            self.id,
            options.concurrency,
            plural(len(names), "handler"),
            ", ".join(names) or "none",
            ", ".join(options.backends) or "none",
            ", ".join(options.queues) if options.queues else "all",
            settings.get("NAME"),
            settings.get("HOST") or "local",
        )
        check_tables(db, options, control)
        check_pooler(db, options, self.listener)
        self.dispatcher.register()
        control.spawn(self.heartbeat.loop, "axa-heartbeat")
        self.watchman.rescue(db.bounded)
        # Once, off the hot path: ready rows of names this code does not know are said now, not a lease later.
        unhandled.warn_at_start(db.bounded, lease=options.lease, registered=registry.registry)
        self.jobs.start()
        control.spawn(self.finisher.loop, "axa-finisher")
        control.spawn(self.watchdog.loop, "axa-watchdog")
        # Running jobs need neither: the dispatcher polls without the listener, and the
        # heartbeat relays cancels too.
        if self.listener.enabled:
            control.spawn(self.listener.loop, "axa-listener", needed=False)
        if not options.burst:
            maintenance = Maintenance(options, options.housekeeping_interval, control.stopping)
            control.spawn(maintenance.loop, "axa-maintenance", needed=False)
        if self.listener.enabled:
            check_notify(db, options, self.listener)
        try:
            self.dispatcher.run(names)
        except BaseException:
            logger.critical(
                "the dispatcher failed; stopping the worker once its jobs in progress finish (exit 1)", exc_info=True
            )
            control.fail("dispatcher")
        return self._shutdown()

    def _shutdown(self) -> int:
        """Stop the parts in order: claims, job threads (or give their jobs back), finisher, listener, the row."""
        options, control, ledger, db = self.options, self.control, self.ledger, self.db
        control.stop()  # the grace period starts now if no stop was asked (a burst worker's end)
        # Each statement of the stop is tried, never raised for failures a lease long: raised
        # out of run(), a stop begun while statements failed ended in a traceback (review).
        db.fail_after_lease = False
        self.dispatcher.unclaim_waiting()
        self.jobs.stop()
        self._wait_for_jobs()
        if control.aborting.is_set():
            ids = ledger.ids()
            if ids and db.execute(sql.RELEASE, {"ids": ids, "worker": self.id}) is not None:
                logger.warning("gave %d job(s) back to the queue", len(ids))
            elif ids:
                logger.warning(
                    "could not give %d job(s) back to the queue (the database is unreachable): they stay running "
                    "under this worker, and the rescue queues them again a lease after its last heartbeat",
                    len(ids),
                )
        else:
            # Every job has finished; wait for the finisher to write their outcomes (an
            # outage that does not end: until the grace period or a second signal aborts).
            while ledger.unwritten() and not control.aborting.is_set():
                control.wake.clear()
                if ledger.unwritten():
                    control.wake.wait(0.1)
        self.finisher.stop()
        if self.listener.enabled:
            db.execute(sql.WAKE, {})  # lets the listener see that we stop
        for thread in control.threads:
            if thread.name in ("axa-heartbeat", "axa-watchdog"):
                continue
            deadline = None
            # Not a thread stuck in a job past its timeout: it may never return. Asked again as
            # it is joined: the watchdog counts a thread stuck just after it releases its job, and
            # a stop that came between joined it for ever (review). An abort (the grace period
            # over while joining, a second signal) waits only for the finisher and the listener,
            # 5 s at most (review).
            while thread.is_alive() and not ledger.is_stuck(thread):
                if control.aborting.is_set():
                    if thread.name not in ("axa-finisher", "axa-listener"):
                        break
                    deadline = deadline or time.monotonic() + 5
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    break
                thread.join(left)
        # A burst worker names the ready jobs it leaves, looked up while it is still registered.
        left = self._left_behind() if options.burst and not control.aborting.is_set() else []
        db.execute(sql.UNREGISTER, {"worker": self.id})
        control.done.set()
        db.close()
        if control.fatal is not None:
            if control.fatal == STUCK:
                logger.critical("worker %s stopped because every job thread was stuck past its timeout", self.id)
            else:
                logger.critical("worker %s stopped because its %s thread died", self.id, control.fatal)
            return 1
        said = summary(ledger.processed, ledger.counts)
        if left:
            logger.warning(
                "worker %s stopped after %s; ready jobs it could not run: %s", self.id, said, "; ".join(left)
            )
        else:
            logger.info("worker %s stopped after %s", self.id, said)
        return 1 if control.aborting.is_set() else 0

    def _wait_for_jobs(self) -> None:
        """Wait for the jobs in progress, until the grace period (timed by ``control``) aborts."""
        control, ledger = self.control, self.ledger
        while ledger.held() and not control.aborting.is_set():
            if not self.jobs.alive():
                self.dispatcher.unclaim_held()
                return
            control.wake.clear()
            if ledger.held():
                control.wake.wait(0.1)

    def _left_behind(self) -> list[str]:
        options = self.options
        return unhandled.left_behind(
            self.db.execute,
            names=options.handler_names(),
            backends=options.backends,
            queues=options.queues,
            lease=options.lease,
            registered=registry.registry,
            every_name=options.names is None,
        )


def _rouse(quiet: Quiet, control: Control) -> None:
    """Rows became claimable that no notification announced: the dispatcher claims again at once (any thread)."""
    quiet.stir()
    control.wake.set()
