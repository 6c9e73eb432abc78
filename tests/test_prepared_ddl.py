"""A worker's prepared claim meeting a migration that changes its result's types."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from axa_django import sql
from axa_django.worker.connection import DispatcherConnection
from axa_django.worker.control import Control
from axa_django.worker.ledger import Ledger
from axa_django.worker.options import Options
from tests.conftest import AXA_APPS
from tests.testapp import jobs

NAME = "tests.testapp.jobs.add"


@pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)
@pytest.mark.parametrize("runs", [1, 6])
def test_a_claim_goes_on_after_a_migration_changes_the_type_of_a_column_it_returns(runs: int) -> None:
    # PostgreSQL fails a prepared statement whose result's types changed ("cached plan must
    # not change result type") at every run, and psycopg keeps it: the dispatcher failed for
    # a lease, then the worker stopped (exit 1). Found by the review of the claims prepared
    # at their first run (runs=1; runs=6 failed the same way before, prepared at the 6th).
    statement = sql.compose(sql.CLAIM_FULL, [NAME], [], None)
    db = DispatcherConnection(Options.build(), Control(), Ledger())
    assert db.open_first()
    params = {"worker": None, "limit": 1, "ahead": False}
    try:
        for _ in range(runs):
            assert db.execute(statement, params, binary=True, repeated=True) is not None
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE axa_queue ALTER COLUMN priority TYPE bigint")
        job = jobs.add.perform_later(1, 2)
        deadline = time.monotonic() + 30
        rows = None
        while rows is None and time.monotonic() < deadline:  # one failed run, then a new connection
            rows = db.execute(statement, params, binary=True, repeated=True)
        assert rows is not None, "the claim never worked again"
        assert [(row[0], row[1]) for row in rows if row[0] is not None] == [(job.id, NAME)]
    finally:
        db.close()
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE axa_queue ALTER COLUMN priority TYPE integer")
