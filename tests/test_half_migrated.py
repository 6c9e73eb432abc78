"""A worker started on tables of an older release says so and exits 2, as on missing tables."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_refuses_a_database_that_lacks_a_migration_of_the_app(workers):
    leaf = max(
        name for app, name in MigrationLoader(None, ignore_no_migrations=True).disk_migrations if app == "axa_django"
    )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'axa_django' AND name = %s RETURNING applied", [leaf])
        (applied,) = cursor.fetchone()
    try:
        proc = workers.start("--burst")
        assert proc.wait(timeout=60) == 2
        output = proc.stdout.read()
        assert f"lacks migration(s) {leaf} of axa_django, which this version needs" in output, output
        assert "run python manage.py migrate first" in output
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO django_migrations (app, name, applied) VALUES ('axa_django', %s, %s)", [leaf, applied]
            )
    proc = workers.start("--burst")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
