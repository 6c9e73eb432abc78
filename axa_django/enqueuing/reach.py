"""Which modules every worker imports, and the warning for a job defined anywhere else.

A worker knows the jobs of the modules that Django imports when it starts: each
installed app's ``jobs`` module (``AppConfig.ready`` autodiscovers it) and whatever
those import, plus the models modules and anything an ``AppConfig.ready`` imports. A
job defined in another module (the settings package ``startproject`` makes, an app
missing from ``INSTALLED_APPS``, a ``tasks.py`` that nothing imports at start, the
script being run) exists only in the processes that import that module: a web
process enqueues it, tests that import it pass, and no worker ever runs it.
"""

from __future__ import annotations

import sys

from django.apps import AppConfig, apps
from django.conf import settings

from ..exceptions import UnreachableJobWarning

__all__ = ["UnreachableJobWarning", "why_unreachable"]


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
