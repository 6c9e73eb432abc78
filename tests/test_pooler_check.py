"""The start-up check for a transaction pooler, on a direct connection: no false alarm.

Behind a real PgBouncer it is tested in tests/test_pgbouncer.py.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection, connections

from axa_django.worker import Worker
from axa_django.worker.startup import check_pooler
from tests.conftest import AXA_APPS

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def test_a_reconnect_during_the_check_is_no_pooler(caplog: pytest.LogCaptureFixture) -> None:
    # The dispatcher's backend changes with its connection: a pid read on the next one is
    # no sign of a pooler handing out backends per transaction.
    caplog.set_level(logging.INFO, logger="axa_django")
    worker = Worker(concurrency=1, install_signals=False)
    db = worker.db
    assert db.open_first()
    try:
        [(pid,)] = db.execute("SELECT pg_backend_pid()", {})
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])  # returns once it has ended
            assert cursor.fetchone() == (True,)
        check_pooler(db, worker.options, worker.listener)
        assert worker.listener.enabled
        assert db.opened == 2
        assert db.execute("SELECT pg_backend_pid() <> %(pid)s", {"pid": pid}) == [(True,)]
    finally:
        db.close()
    assert [r for r in caplog.records if r.getMessage().startswith("dispatcher lost the database")]


def test_the_checks_reads_are_never_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    # Behind a transaction pooler a statement prepared in one transaction runs in another,
    # and the check failed there instead of finding the pooler.
    options = connections["default"].settings_dict.get("OPTIONS", {})
    monkeypatch.setitem(connections["default"].settings_dict, "OPTIONS", {**options, "prepare_threshold": 0})
    worker = Worker(concurrency=1, install_signals=False)
    db = worker.db
    assert db.open_first()
    try:
        check_pooler(db, worker.options, worker.listener)
        assert worker.listener.enabled
        assert db.opened == 1
        prepared = "SELECT count(*) FROM pg_prepared_statements WHERE statement = 'SELECT pg_backend_pid()'"
        assert db.execute(prepared, {}) == [(0,)]
    finally:
        db.close()
