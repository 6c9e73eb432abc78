"""System checks for the AXA_DJANGO setting and the queue database."""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import itertools
from typing import Any

import django
import psycopg
from django.conf import settings
from django.core import checks
from django.db import DatabaseError
from django.utils.module_loading import import_string

from . import conf
from .ops import budget

# Kept importable from here for callers written before the rules moved to conf.
MODES = conf.MODES
other_vendor = conf.other_vendor


def messages(user: Any) -> list[checks.CheckMessage]:
    """The system check errors for ``user`` as an AXA_DJANGO setting (the same rules conf raises on)."""
    found = conf.problems(user)
    if isinstance(user, dict):
        alias = user.get("DATABASE", conf.DEFAULTS["DATABASE"])
        if not any(p.id == "axa_django.E005" for p in found) and (problem := conf.vendor_problem(alias)):
            # E006 after E005's place, before E007, as the checks always listed them.
            at = next((i for i, p in enumerate(found) if p.id == "axa_django.E007"), len(found))
            found.insert(at, problem)
    return [checks.Error(p.message, hint=p.hint, id=p.id) for p in found]


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a malformed AXA_DJANGO setting before a worker or view trips on it."""
    return messages(conf.user_setting())


@checks.register(checks.Tags.database)
def check_connection_budget(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (W001) when the live workers' connections plus a margin reach the server's max_connections.

    A database check: ``manage.py check --database default`` (and ``migrate``) run it;
    an unreachable or unmigrated database is left to the checks that report it.
    """
    alias = conf.alias_as_written()
    if not databases or alias not in databases or conf.problems(conf.user_setting()) or conf.vendor_problem(alias):
        return []
    try:
        found = budget.fleet(alias, float(conf.get("LEASE_SECONDS")))
    except (DatabaseError, psycopg.Error):
        return []
    if not found.tight:
        return []
    message, hint = budget.warning_text(found)
    return [checks.Warning(message, hint=hint, id="axa_django.W001")]


# The OPTIONS QueueBackend reads (settings.TASKS[alias]["OPTIONS"]).
TASK_OPTIONS = ("MAX_ATTEMPTS", "BACKOFF")
QUEUE_BACKEND = "axa_django.backends.QueueBackend"
# The oldest backport whose API is Django 6's (SUCCESSFUL, not 0.9-0.11's SUCCEEDED).
BACKPORT_OLDEST = (0, 12)


def task_option_problems(alias: str, options: Any) -> list[str]:
    """What is wrong with a QueueBackend's OPTIONS (none: []), each with how to write it."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        return [f"{where} must be a dict, not {type(options).__name__}"]
    problems = []
    for key in sorted(set(options) - set(TASK_OPTIONS), key=str):
        close = difflib.get_close_matches(str(key), TASK_OPTIONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{where} has an unknown key {key!r}{hint}; known keys: {', '.join(TASK_OPTIONS)}")
    attempts = options.get("MAX_ATTEMPTS")
    if attempts is not None and (type(attempts) is not int or not 0 < attempts < 2**31):
        problems.append(f"{where}['MAX_ATTEMPTS'] must be a positive int below 2147483648, not {attempts!r}")
    backoff = options.get("BACKOFF")
    if backoff is not None and (isinstance(backoff, bool) or not isinstance(backoff, int | float) or backoff < 0):
        problems.append(f"{where}['BACKOFF'] must be a number of seconds >= 0, not {backoff!r}")
    return problems


def tasks_framework_problem() -> str | None:
    """Why QueueBackend cannot serve tasks in this environment (None: it can), without importing a framework."""
    if django.VERSION >= (6, 0):
        return None
    try:
        found = importlib.metadata.version("django-tasks")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is None or not _importable("django_tasks"):
        return (
            f"axa_django.backends needs django.tasks (Django >= 6.0) or, on Django {django.get_version()}, "
            "the django-tasks backport, which is not installed: pip install 'axa-django[tasks]' (django-tasks >= "
            f"{'.'.join(map(str, BACKPORT_OLDEST))}), then list 'django_tasks' in INSTALLED_APPS as the backport asks"
        )
    if _version(found) < BACKPORT_OLDEST:
        return (
            f"axa_django.backends needs django-tasks >= {'.'.join(map(str, BACKPORT_OLDEST))} on Django "
            f"{django.get_version()}, and {found} is installed (its API predates Django 6's): "
            f"pip install -U 'django-tasks>={'.'.join(map(str, BACKPORT_OLDEST))}'"
        )
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):  # a module set to None in sys.modules: blocked
        return False


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        parts.append(int(digits or 0))
    return tuple(parts)


def _is_queue_backend(path: Any) -> bool:
    """Whether a TASKS BACKEND path names QueueBackend or a subclass (a broken path: no, Django reports it)."""
    if path == QUEUE_BACKEND:
        return True
    # Django's and the backport's own backends are no subclass of it: not imported here.
    if not isinstance(path, str) or path.partition(".")[0] in ("django", "django_tasks", ""):
        return False
    try:
        found = import_string(path)
    except Exception:  # noqa: BLE001 - a user's module may raise anything; Django's own checks say so
        return False
    mro = getattr(found, "__mro__", ())
    return any(f"{cls.__module__}.{cls.__qualname__}" == QUEUE_BACKEND for cls in mro)


@checks.register()
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E103: a QueueBackend's OPTIONS with a typo or a bad value; E104: no tasks framework to serve it.

    Read from settings as written, without importing a tasks framework: the check runs
    on Django 5.2 without the backport too, and whether or not Django lists its own checks.
    """
    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return []
    found: list[checks.CheckMessage] = []
    framework = tasks_framework_problem()
    for alias, params in tasks.items():
        if not isinstance(params, dict) or not _is_queue_backend(params.get("BACKEND")):
            continue
        if framework is not None:
            found.append(checks.Error(f"TASKS[{alias!r}] uses QueueBackend, but {framework}.", id="axa_django.E104"))
            continue
        for problem in task_option_problems(str(alias), params.get("OPTIONS", {})):
            found.append(
                checks.Error(
                    problem,
                    hint="OPTIONS takes MAX_ATTEMPTS (a positive int) and BACKOFF (seconds >= 0).",
                    id="axa_django.E103",
                )
            )
    return found
