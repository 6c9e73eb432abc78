"""A job no worker would know is reported where the user looks: at decoration, in the test helpers, at a worker's start.

The README's first job once lived in the settings package of a ``startproject`` site:
never autodiscovered, so workers never knew it, while the user's tests passed.
tests/test_setup.py builds such a site; these tests check each report on its own.
"""

from __future__ import annotations

import signal
import sys
import types
import warnings
from collections.abc import Iterator

import pytest
from django.apps import apps

from axa_django import UnreachableJobWarning, background_job
from axa_django.enqueuing import reach
from axa_django.registry import registry
from axa_django.testing import assert_enqueued, run_jobs
from tests.conftest import AXA_APPS, Workers, wait_for
from tests.test_worker_mistakes import insert, output_of
from tests.testapp import jobs

FIX_APP = (
    "Make an app (python manage.py startapp <name>), add it to INSTALLED_APPS and move the job into <name>/jobs.py."
)
JOB = "@background_job\ndef greet(name: str) -> str:\n    return 'hello ' + name\n"


@pytest.fixture
def define() -> Iterator[types.FunctionType]:
    """Run module code as module ``name`` (its jobs get that module); the jobs are unregistered afterwards."""
    before = set(registry)

    def run(name: str, code: str = JOB) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__dict__["background_job"] = background_job
        module.__dict__["run_as"] = run  # for a jobs module that imports another module
        exec(compile(code, f"<{name}>", "exec"), module.__dict__)
        return module

    yield run  # type: ignore[misc]
    for name in set(registry) - before:
        del registry[name]


def warned(define, module: str, code: str = JOB) -> str:
    with pytest.warns(UnreachableJobWarning) as caught:
        define(module, code)
    [warning] = caught
    return str(warning.message)


def test_a_job_in_the_settings_package_warns_at_decoration_naming_job_module_and_fix(define):
    # tests.settings is this suite's settings module, as site1.settings is a startproject site's.
    message = warned(define, "tests.jobs")
    assert message == (
        "job 'tests.jobs.greet' is defined where no worker will find it: module 'tests.jobs' is in no installed app "
        "('tests' is the project package that holds the settings, tests.settings, not an app); workers import only "
        f"each installed app's jobs module (<app>/jobs.py) when Django starts. {FIX_APP}"
    )
    assert registry["tests.jobs.greet"].unreachable == message


def test_a_job_of_an_app_that_is_not_installed_warns(define):
    message = warned(define, "billing.jobs")
    assert message.startswith("job 'billing.jobs.greet' is defined where no worker will find it: ")
    assert "module 'billing.jobs' is in no installed app; " in message and message.endswith(FIX_APP)


def test_a_job_outside_the_jobs_module_of_an_installed_app_warns(define):
    message = warned(define, "tests.testapp.tasks")
    assert message.endswith(
        "module 'tests.testapp.tasks' is not the jobs module of the installed app 'tests.testapp'; workers import "
        "only each installed app's jobs module (<app>/jobs.py) when Django starts. "
        "Move the job into tests/testapp/jobs.py, or import tests.testapp.tasks from it."
    )


def test_a_job_in_the_script_being_run_warns(define):
    message = warned(define, "__main__")
    assert message.startswith("job '__main__.greet' is defined where no worker will find it: in the script being run")


def test_the_warning_points_at_the_line_that_defines_the_job(define, tmp_path, monkeypatch):
    (tmp_path / "pointed").mkdir()
    (tmp_path / "pointed" / "__init__.py").write_text("")
    (tmp_path / "pointed" / "jobs.py").write_text("from axa_django import background_job\n\n" + JOB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pointed.jobs", raising=False)
    with pytest.warns(UnreachableJobWarning) as caught:
        __import__("pointed.jobs")
    sys.modules.pop("pointed.jobs")
    sys.modules.pop("pointed")
    del registry["pointed.jobs.greet"]
    assert (caught[0].filename, caught[0].lineno) == (str(tmp_path / "pointed" / "jobs.py"), 3)


@pytest.mark.parametrize(
    "module",
    [
        "tests.testapp.jobs",  # an installed app's jobs module (autodiscovered)
        "tests.testapp.jobs.emails",  # a module of an installed app's jobs package
    ],
)
def test_jobs_a_worker_imports_do_not_warn(define, module):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)
        define(module)
    assert registry[f"{module}.greet"].unreachable is None


def test_a_module_imported_by_an_installed_apps_jobs_module_does_not_warn(define):
    # tests.testapp.jobs does this with its *_jobs modules: workers import them through it.
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)
        define("tests.testapp.jobs", "run_as('tests.testapp.mail_jobs')")
    assert registry["tests.testapp.mail_jobs.greet"].unreachable is None


def test_nothing_is_said_while_django_sets_up(monkeypatch):
    # Models modules, AppConfig.ready and the autodiscovery run in every process that
    # sets Django up, workers included: what they define is known to every worker.
    monkeypatch.setattr(apps, "ready", False)
    assert reach.why_unreachable("x.greet", "nowhere.jobs") is None
    assert reach.why_unreachable("x.greet", "__main__") is not None  # no worker runs the script


def test_the_suites_autodiscovered_jobs_are_known_to_workers():
    assert jobs.add.unreachable is None and registry["CountWorker"].unreachable is None


# -- the test helpers ------------------------------------------------------------------


@pytest.mark.django_db
def test_run_jobs_and_assert_enqueued_warn_about_a_job_no_worker_would_know(define):
    with pytest.warns(UnreachableJobWarning):
        greet = define("site1.jobs").greet
    message = greet.unreachable
    greet.perform_later("ada")
    with pytest.warns(UnreachableJobWarning) as caught:
        assert_enqueued(greet, name="ada")
    assert [str(w.message) for w in caught] == [f"assert_enqueued(): {message}"]
    assert caught[0].filename == __file__  # the test's line, not the helper's
    with pytest.warns(UnreachableJobWarning) as caught:
        assert_enqueued("site1.jobs.greet", name="ada")  # by name too
    with pytest.warns(UnreachableJobWarning) as caught:
        [attempt] = run_jobs()
    assert attempt.result == "hello ada"  # it ran here; in production it would wait forever
    assert [str(w.message) for w in caught] == [f"run_jobs(): {message}"]
    assert caught[0].filename == __file__


@pytest.mark.django_db
def test_run_jobs_and_assert_enqueued_are_quiet_about_jobs_workers_know():
    jobs.add.perform_later(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)
        assert_enqueued(jobs.add, a=1)
        [attempt] = run_jobs()
    assert attempt.result == 3


# -- a worker's start ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
def test_a_worker_names_ready_jobs_of_names_it_does_not_know_at_start(workers: Workers):
    insert("shop.jobs.send_welcome", 2)  # enqueued by a web process that knew it
    insert("tests.testapp.jobs.add")  # known here, left out by --job: said a lease later, not at start
    # A lease of 30 s, the default: the full look waits that long, so a warning within
    # a few seconds is the start's.
    proc = workers.start("--job", "CountWorker", env=workers.env(AXA_TEST_LEASE="30"))
    lines = output_of(proc)
    wait_for(
        lambda: any("shop.jobs.send_welcome" in line for line in lines),
        timeout=8,
        what="the worker's start-time warning about shop.jobs.send_welcome",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    out = "".join(lines)
    assert (
        "job 'shop.jobs.send_welcome' in queue 'default': 2 ready and no live worker claims them "
        "(is the job in the jobs.py of an installed app (a startproject's settings package is not one)"
    ) in out, out
    assert "job 'tests.testapp.jobs.add' in queue 'default': 1 ready and no live worker" not in out, out
