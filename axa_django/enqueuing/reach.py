"""Which modules every worker imports, and the warnings for a job no worker may run.

A worker knows the jobs of the modules that Django imports when it starts: each
installed app's ``jobs`` module (``AppConfig.ready`` autodiscovers it) and whatever
those import, plus the models modules and anything an ``AppConfig.ready`` imports. A
job defined in another module (the settings package ``startproject`` makes, an app
missing from ``INSTALLED_APPS``, a ``tasks.py`` that nothing imports at start, the
script being run) exists only in the processes that import that module: a web
process enqueues it, tests that import it pass, and no worker ever runs it.

A job enqueued by a name no job of this process has, or into a queue nothing here
declares (a typo: ``enqueue("shop.jobs.send_welcom")``, ``using(queue="emials")``), is
written all the same and waits, perhaps forever: ``VERDICTS`` judges each (name, queue)
once, and ``warning_text`` says so.
"""

from __future__ import annotations

import difflib
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.db import DatabaseError, connections, transaction

from .. import conf
from ..exceptions import UnknownJobWarning, UnknownQueueWarning, UnreachableJobWarning

__all__ = [
    "VERDICTS",
    "UnknownJobWarning",
    "UnknownQueueWarning",
    "UnreachableJobWarning",
    "Verdict",
    "Verdicts",
    "warning_text",
    "why_unreachable",
]


def why_unreachable(job: str, module: str | None) -> str | None:
    """The warning for job ``job`` defined in ``module``, naming the fix; None if every worker imports it.

    While Django is still setting up (models modules, ``AppConfig.ready``, the jobs
    autodiscovery and what it imports) nothing is reported: every process that sets
    Django up with the same settings, workers included, imports the same modules. A
    job defined in ``__main__`` is always reported: no worker runs the script.
    """
    lead = f"job {job!r} is defined where no worker will find it:"
    if module == "__main__":
        return (
            f"{lead} in the script being run (__main__), which no worker imports. "
            "Move the job into the jobs.py of an installed app and import it from there."
        )
    if module is None or not apps.ready or _inside_jobs_import():
        return None
    app = apps.get_containing_app_config(module)
    if app is not None and _is_jobs_module(module, app):
        return None
    rule = "workers import only each installed app's jobs module (<app>/jobs.py) when Django starts"
    if app is None:
        top = module.partition(".")[0]
        what = f"module {module!r} is in no installed app"
        settings_module = getattr(settings, "SETTINGS_MODULE", None) or ""
        if top == settings_module.partition(".")[0]:
            what += f" ({top!r} is the project package that holds the settings, {settings_module}, not an app)"
        return (
            f"{lead} {what}; {rule}. Make an app (python manage.py startapp <name>), add it to "
            "INSTALLED_APPS and move the job into <name>/jobs.py."
        )
    path = app.name.replace(".", "/") + "/jobs.py"
    return (
        f"{lead} module {module!r} is not the jobs module of the installed app {app.name!r}; {rule}. "
        f"Move the job into {path}, or import {module} from it."
    )


def _is_jobs_module(module: str, app: AppConfig) -> bool:
    jobs = f"{app.name}.jobs"
    return module == jobs or module.startswith(jobs + ".")


def _inside_jobs_import() -> bool:
    """Whether an installed app's jobs module is being imported: what it imports is imported by workers too."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            name = frame.f_globals.get("__name__")
            if isinstance(name, str):
                app = apps.get_containing_app_config(name)
                if app is not None and _is_jobs_module(name, app):
                    return True
        frame = frame.f_back
    return False


def did_you_mean(word: str, known: Iterable[str]) -> list[str]:
    """Up to three of ``known`` that ``word`` was probably meant as: the same last dotted part, then the closest.

    One closest only: dotted names share long prefixes, which make many of them close.
    """
    candidates = sorted(set(known) - {word})
    tail = word.rsplit(".", 1)[-1].lower()
    same_tail = [k for k in candidates if k.rsplit(".", 1)[-1].lower() == tail]
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return list(dict.fromkeys(same_tail + close))[:3]


# What an enqueue of (job name, queue) is told: None when this process knows both, else
# the warning's class and what the name or queue was likely meant as. The message is
# built when shown, from these and the key: a verdict stays a few dozen bytes.
Verdict = tuple[type[UnreachableJobWarning], tuple[str, ...]] | None

# Verdicts kept at most; past that the oldest goes (per-tenant queues come and go).
MOST_VERDICTS = 1000
# Options.queue's default (options sits above this module).
_DEFAULT_QUEUE = "default"
# The queues an operator paused or limited (manage.py queues pause / limit): runworker's
# --queue counts them as known, and so does the verdict.
TABLE_QUEUES = "SELECT queue FROM axa_paused_queue UNION SELECT queue FROM axa_queue_limit"
_UNSEEN: Any = object()


class Verdicts:
    """The verdict of each (job name, queue) enqueued so far, judged once.

    ``cache`` is read without a lock (a dict's get is atomic): an enqueue of a known job
    into a known queue costs that one lookup. It is written under ``lock``. ``forget``
    (a job registered, the settings changed) starts a new generation: a judgement begun
    before it is not stored, as it may not have seen what was registered. Judgements read
    the registry through snapshots, which another thread registering a job cannot change
    under them.
    """

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str], Verdict] = {}
        self.lock = threading.Lock()
        self.generation = 0
        # TABLE_QUEUES' answer, read at most once a generation, when a queue would otherwise be warned about.
        self.tables: frozenset[str] | None = None

    def forget(self) -> None:
        """Judge afresh from now on, the paused and limited queues read again when needed."""
        with self.lock:
            self.generation += 1
            self.cache.clear()
            self.tables = None

    def verdict(self, name: str, queue: str, jobs: Mapping[str, Any]) -> Verdict:
        """The verdict for enqueueing job ``name`` into ``queue``; ``jobs``: the registry (name -> JobFunction)."""
        key = (name, queue)
        found = self.cache.get(key, _UNSEEN)
        if found is not _UNSEEN:
            return found  # type: ignore[no-any-return]
        generation = self.generation  # read before the snapshots: a later registration bumps it
        found, sure = self._judge(name, queue, jobs, generation)
        if not sure:
            return found  # judged without the paused and limited queues: judged again next time
        with self.lock:
            if self.generation == generation and key not in self.cache:
                if len(self.cache) >= MOST_VERDICTS:
                    del self.cache[next(iter(self.cache))]
                self.cache[key] = found
        return found

    def _judge(self, name: str, queue: str, jobs: Mapping[str, Any], generation: int) -> tuple[Verdict, bool]:
        """The verdict, and whether it may be kept: not if the paused and limited queues could not be read."""
        known_jobs = conf.get("KNOWN_JOBS")
        if name not in jobs and name not in known_jobs:
            return (UnknownJobWarning, tuple(did_you_mean(name, (*tuple(jobs), *known_jobs)))), True
        queues = code_queues(tuple(jobs.values()))
        if queue in queues:
            return None, True  # a registered job's own queue never costs a query
        tables = self.tables
        if tables is None:
            tables = table_queues()
            if tables is None:
                # One failed read (a caller's broken transaction, a blip) must not stand for the
                # process's lifetime: warned about now, read again at the next enqueue.
                return (UnknownQueueWarning, tuple(did_you_mean(queue, queues))), False
            with self.lock:
                if self.generation == generation:
                    self.tables = tables
        if queue in tables:
            return None, True
        return (UnknownQueueWarning, tuple(did_you_mean(queue, queues | tables))), True


VERDICTS = Verdicts()


def code_queues(jobs: Iterable[Any]) -> frozenset[str]:
    """The queues the code and the settings know: "default", ``jobs``' queues, settings.TASKS' QUEUES and
    AXA_DJANGO["KNOWN_QUEUES"]."""
    queues = {_DEFAULT_QUEUE, *conf.get("KNOWN_QUEUES")}
    queues.update(job.options.queue for job in jobs)
    tasks = getattr(settings, "TASKS", None)
    for params in tasks.values() if isinstance(tasks, dict) else ():
        # Any backend's: a queue a project names anywhere is not a typo.
        listed = params.get("QUEUES", ()) if isinstance(params, dict) else ()
        queues.update(queue for queue in listed if isinstance(queue, str))
    return frozenset(queues)


def table_queues() -> frozenset[str] | None:
    """The queues paused or limited in the queue database; None when they cannot be read.

    Read in a savepoint (a transaction of its own outside one): an enqueue inside the
    caller's transaction goes on as it would have, whatever this query met (tables not
    migrated yet, a broken transaction, a lost connection), and the error is the enqueue's to say.
    """
    alias = conf.get("DATABASE")
    try:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            cursor.execute(TABLE_QUEUES)
            return frozenset(queue for (queue,) in cursor.fetchall())
    except DatabaseError:
        return None


def _guess(guesses: tuple[str, ...]) -> str:
    return f"Did you mean {' or '.join(map(repr, guesses))}? " if guesses else ""


def _literal(pattern: str) -> str:
    """``pattern`` as a Python string literal to paste: raw when it holds backslashes."""
    if '"' in pattern:
        return repr(pattern)
    return f'r"{pattern}"' if "\\" in pattern else f'"{pattern}"'


def _silence(category: type[Warning], kind: str, subject: str, setting: str) -> str:
    # The message filter is a regular expression matched at the start of the message,
    # which names the subject: escaped, a name such as 'Mailer(v2)' matches itself.
    pattern = f"{kind} {re.escape(repr(subject))}"
    return (
        f"list it in AXA_DJANGO[{setting!r}] in settings.py, or silence this warning there: warnings.filterwarnings("
        f"'ignore', category=axa_django.{category.__name__}, message={_literal(pattern)})"
    )


def warning_text(name: str, queue: str, verdict: tuple[type[UnreachableJobWarning], tuple[str, ...]]) -> str:
    """The message of ``verdict`` for enqueueing job ``name`` into ``queue``.

    It begins with its subject (``job 'x'``, ``queue 'y'``), so a filter can silence one
    name or queue, and ends with that filter.
    """
    category, guesses = verdict
    if category is UnknownJobWarning:
        return (
            f"job {name!r} is enqueued, but no job of this process is registered under that name, so no worker of "
            f"this project runs it: the row waits until a worker that defines it claims it. {_guess(guesses)}"
            "If another service runs it (a Rust worker, another Django project), "
            f"{_silence(category, 'job', name, 'KNOWN_JOBS')}"
        )
    return (
        f"queue {queue!r} (job {name!r}) is declared by no registered job, listed by no backend in settings.TASKS "
        "nor in AXA_DJANGO['KNOWN_QUEUES'], and neither paused nor limited: a worker started with --queue takes "
        f"only the queues it names, so the row may wait forever. {_guess(guesses)}If a worker serves it "
        f"(runworker --queue {queue}), {_silence(category, 'queue', queue, 'KNOWN_QUEUES')}"
    )
