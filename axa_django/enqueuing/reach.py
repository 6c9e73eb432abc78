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
written all the same and waits, perhaps forever: ``unknown_target`` says so.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Iterable

from django.apps import AppConfig, apps
from django.conf import settings

from ..exceptions import UnknownJobWarning, UnknownQueueWarning, UnreachableJobWarning

__all__ = ["UnknownJobWarning", "UnknownQueueWarning", "UnreachableJobWarning", "unknown_target", "why_unreachable"]


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


def _guess(word: str, known: Iterable[str]) -> str:
    guesses = did_you_mean(word, known)
    return f"Did you mean {' or '.join(map(repr, guesses))}? " if guesses else ""


def _silence(category: type[Warning], subject: str) -> str:
    # The message filter matches the start of the message, which names the subject.
    return (
        f"silence this warning in settings.py: warnings.filterwarnings('ignore', "
        f'category=axa_django.{category.__name__}, message="{subject}")'
    )


def unknown_target(
    name: str, queue: str, names: Collection[str], queues: Collection[str]
) -> tuple[type[UnreachableJobWarning], str] | None:
    """The warning for enqueueing job ``name`` into ``queue``, or None when this process knows both.

    ``names``: the jobs registered here; ``queues``: the queues known here (registered
    jobs' queues, settings.TASKS' QUEUES, "default"). Each message begins with its
    subject (``job 'x'``, ``queue 'y'``), so a filter can silence one name or queue.
    """
    if name not in names:
        subject = f"job {name!r}"
        return UnknownJobWarning, (
            f"{subject} is enqueued, but no job of this process is registered under that name, so no worker of "
            f"this project runs it: the row waits until a worker that defines it claims it. {_guess(name, names)}"
            "If another service runs it (a Rust worker, another Django project), "
            f"{_silence(UnknownJobWarning, subject)}"
        )
    if queue not in queues:
        subject = f"queue {queue!r}"
        return UnknownQueueWarning, (
            f"{subject} (job {name!r}) is declared by no registered job and listed by no backend in settings.TASKS: "
            f"a worker started with --queue takes only the queues it names, so the row may wait forever. "
            f"{_guess(queue, queues)}If a worker serves it (runworker --queue {queue}), "
            f"{_silence(UnknownQueueWarning, subject)}"
        )
    return None
