"""Mistakes a new user makes are refused at once, naming what is wrong and how to fix it (issue 12)."""

import math
import subprocess
import sys
import textwrap

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from axa_django import background_job, conf, enqueue_many
from axa_django import checks as axa_checks
from axa_django.registry import JobFunction, registry
from tests.conftest import ROOT, database_url
from tests.testapp import jobs
from tests.testapp.setup12_jobs import negative_backoff, only_args, spread

# -- the AXA_DJANGO setting is validated when first read --------------------------


@pytest.mark.parametrize(
    ("setting", "text"),
    [
        ({"mode": "immediate"}, "AXA_DJANGO has an unknown key 'mode'. Did you mean 'MODE'?"),
        ({"POLL_INTERVALL": 1}, "unknown key 'POLL_INTERVALL'. Did you mean 'POLL_INTERVAL'?"),
        ({"COLOUR": "red"}, "unknown key 'COLOUR'. Known keys: CRON_TIMEZONE, DATABASE,"),
        ({1: 2}, "AXA_DJANGO has an unknown key 1. Known keys:"),
        ("queue", "AXA_DJANGO must be a dict, not str."),
        ({"MODE": "eager"}, "AXA_DJANGO['MODE'] is 'eager'; it must be 'queue' or 'immediate'."),
        ({"POLL_INTERVAL": "1"}, "AXA_DJANGO['POLL_INTERVAL'] is '1'; it must be a positive number of seconds."),
        ({"NOTIFY": "no"}, "AXA_DJANGO['NOTIFY'] is 'no'; it must be True or False."),
        ({"DATABASE": "nope"}, "AXA_DJANGO['DATABASE'] is 'nope', which is not in DATABASES."),
        ({"CRON_TIMEZONE": "Mars/Olympus"}, "'Mars/Olympus', which is not a known time zone."),
    ],
)
def test_a_bad_setting_raises_improperly_configured_when_first_read(setting, text):
    with override_settings(AXA_DJANGO=setting), pytest.raises(ImproperlyConfigured) as raised:
        conf.get("MODE")
    message = str(raised.value)
    assert message.startswith("settings.AXA_DJANGO is invalid; fix it in your settings module:")
    assert text in message
    # The same rule, with the same id, is what manage.py check reports.
    with override_settings(AXA_DJANGO=setting):
        ids = [m.id for m in axa_checks.check_settings()]
    assert len(ids) == 1 and f"({ids[0]})" in message


def test_every_problem_is_listed_at_once():
    with (
        override_settings(AXA_DJANGO={"mode": "immediate", "POLL_INTERVAL": 0}),
        pytest.raises(ImproperlyConfigured) as raised,
    ):
        conf.get("MODE")
    lines = str(raised.value).splitlines()[1:]
    assert [line.rsplit(" ", 1)[-1] for line in lines] == ["(axa_django.E002)", "(axa_django.E004)"]


def test_system_checks_can_read_the_alias_of_a_bad_setting_without_raising():
    with override_settings(AXA_DJANGO={"mode": "immediate", "DATABASE": "sqlite"}):
        assert conf.alias_as_written() == "sqlite"
        assert [m.id for m in axa_checks.check_settings()] == ["axa_django.E002", "axa_django.E006"]
    with override_settings(AXA_DJANGO=["DATABASE"]):
        assert conf.alias_as_written() == "default"


def test_enqueue_with_a_typo_in_the_setting_raises_before_writing():
    # No django_db mark: any query would fail the test, so nothing reached the database.
    with override_settings(AXA_DJANGO={"mode": "immediate"}), pytest.raises(ImproperlyConfigured, match="'MODE'"):
        jobs.add.perform_later(1)


def test_manage_check_reports_a_typo_with_its_id_and_shell_refuses_to_enqueue(tmp_path):
    """What gunicorn, shell and pytest-django see: the error, not a silently ignored key."""
    (tmp_path / "typo_settings.py").write_text(
        textwrap.dedent(
            f"""
            from axa_django.devdb import parse_url
            SECRET_KEY = "x"
            INSTALLED_APPS = ["axa_django"]
            DATABASES = {{"default": parse_url({database_url()!r})}}
            USE_TZ = True
            AXA_DJANGO = {{"mode": "immediate"}}
            """
        )
    )
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "typo_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}

    def django(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", *args], env=env, capture_output=True, text=True, timeout=60
        )

    check = django("check")
    assert check.returncode == 1
    assert "axa_django.E002" in check.stderr and "Did you mean 'MODE'?" in check.stderr, check.stderr
    shell = django("shell", "-c", "from axa_django import enqueue; enqueue('x')")
    assert shell.returncode == 1
    assert "ImproperlyConfigured: settings.AXA_DJANGO is invalid" in shell.stderr, shell.stderr


# -- a queue database that is not PostgreSQL --------------------------------------


@override_settings(AXA_DJANGO={"DATABASE": "sqlite"})
@pytest.mark.parametrize(
    "call",
    [
        lambda: jobs.add.perform_later(1),
        lambda: jobs.add.perform_later_many([{"a": 1}]),
        lambda: enqueue_many("elsewhere", [{}]),
        lambda: override_settings(AXA_DJANGO={"DATABASE": "sqlite", "MODE": "immediate"})(jobs.add.perform_later)(1),
    ],
    ids=["perform_later", "perform_later_many", "enqueue_many", "immediate"],
)
def test_enqueue_on_sqlite_raises_the_e006_error_before_any_sql(call):
    # No django_db mark: a query on either alias would fail the test.
    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(ImproperlyConfigured) as raised:
            call()
        assert str(raised.value).startswith("The queue database 'sqlite' uses sqlite, not PostgreSQL.")
        assert str(raised.value).endswith("(axa_django.E006)")


# -- *args / **kwargs jobs -----------------------------------------------------------


@pytest.mark.django_db
def test_var_positional_and_var_keyword_arguments_are_stored_as_array_and_object():
    job = spread.perform_later(1, 2, 3, scale=2, x=5)
    job.refresh_from_db()
    assert job.args == {"first": 1, "rest": [2, 3], "scale": 2, "named": {"x": 5}}
    assert only_args.perform_later().args == {}
    assert only_args.perform_later("a", [1]).args == {"args": ["a", [1]]}


def test_a_tuple_inside_star_args_is_still_refused_by_place():
    with pytest.raises(TypeError, match=r"argument 'args' of job '[^']+only_args'\[0\] is a tuple"):
        only_args.perform_later((1, 2))


@pytest.mark.django_db
@override_settings(AXA_DJANGO={"MODE": "immediate"})
def test_star_args_jobs_run_inline_in_immediate_mode():
    job = spread.perform_later(1, 2, scale=3, y=1)
    assert (job.status, job.result) == ("completed", {"sum": 9, "named": {"y": 1}})


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_star_args_jobs_and_a_negative_backoff_retries_at_once(workers):
    first = spread.perform_later(1, 2, 3, scale=2, x=5)
    second = only_args.perform_later(1, "two", None)
    retried = negative_backoff.perform_later()
    burst = workers.manage("runworker", "--burst")
    assert burst.returncode == 0, burst.stdout + burst.stderr
    for job in (first, second, retried):
        job.refresh_from_db()
    assert (first.status, first.result) == ("completed", {"sum": 12, "named": {"x": 5}})
    assert (second.status, second.result) == ("completed", [1, "two", None])
    # Attempt 1 asked for a retry 100 s in the past: it was treated as 0, not stored in the past.
    assert (retried.status, retried.attempts, len(retried.errors)) == ("failed", 2, 2)
    assert retried.run_at >= retried.created_at


# -- backoff -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "error", "text"),
    [
        (-1, ValueError, "backoff is -1; it must be a number of seconds from 0 to"),
        (-0.5, ValueError, "backoff is -0.5"),
        (math.nan, ValueError, "backoff is nan"),
        (math.inf, ValueError, "backoff is inf"),
        (1e300, ValueError, "backoff is 1e+300"),
        ("5", TypeError, "backoff must be a number of seconds or a callable, not str"),
        (True, TypeError, "not bool"),
        (lambda: 1, TypeError, "cannot be called with one argument (the attempt number)"),
        (lambda attempt, factor: 1, TypeError, "cannot be called with one argument"),
    ],
)
def test_a_backoff_that_cannot_space_retries_is_refused_at_decoration(backoff, error, text):
    with pytest.raises(error) as raised:

        @background_job(name="setup12.bad_backoff", backoff=backoff)
        def job() -> None: ...

    assert "job 'setup12.bad_backoff': " in str(raised.value) and text in str(raised.value)
    assert "setup12.bad_backoff" not in registry


@pytest.mark.parametrize("backoff", [None, 0, 2.5, 86400, lambda attempt: 2**attempt, lambda *a: 1, abs])
def test_usable_backoffs_are_accepted(backoff):
    job = JobFunction(lambda: None, name="setup12.good_backoff", backoff=backoff)
    assert job.retry_delay(1) >= 0
