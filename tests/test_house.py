"""The house: one initial migration that builds exactly what the models declare."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection, transaction

import axa_django

MIGRATIONS = Path(axa_django.__file__).parent / "migrations"
TABLES = (
    "axa_queue",
    "axa_worker",
    "axa_schedule",
    "axa_paused_queue",
    "axa_queue_limit",
    "axa_rate_bucket",
    "axa_dependency",
    "axa_workflow",
    "axa_finished_hour",
    "axa_name_span",
    "axa_name_stat",
    "axa_bulk_operation",
)
PROBE = "axa_house_probe"

# Columns, defaults, indexes and constraints of the app's tables in one schema.
CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, column_default
        FROM information_schema.columns WHERE table_schema = %s AND table_name = ANY(%s)
    """,
    "indexes": """
        SELECT tablename, indexname, replace(indexdef, %s || '.', '')
        FROM pg_indexes WHERE schemaname = %s AND tablename = ANY(%s)
    """,
    "constraints": """
        SELECT t.relname, c.conname, c.contype, pg_get_constraintdef(c.oid)
        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = %s AND t.relname = ANY(%s)
    """,
}


def catalog(schema: str) -> dict[str, set[tuple[object, ...]]]:
    with connection.cursor() as cursor:
        facts = {}
        for kind, query in CATALOG.items():
            params = [schema, schema, list(TABLES)] if kind == "indexes" else [schema, list(TABLES)]
            cursor.execute(query, params)
            facts[kind] = set(cursor.fetchall())
    return facts


def test_the_app_has_one_initial_migration():
    # Squashed before the first release (docs/upgrading.md).
    assert sorted(path.name for path in MIGRATIONS.glob("0*.py")) == ["0001_initial.py"]


@pytest.mark.django_db
def test_the_migrated_schema_is_the_models_schema():
    """Tables built straight from the models (in a scratch schema) match the migrated ones."""
    migrated = catalog("public")
    models = [model for model in apps.get_app_config("axa_django").get_models() if not model._meta.proxy]
    assert {model._meta.db_table for model in models} == set(TABLES)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {PROBE}")
            cursor.execute(f"SET LOCAL search_path TO {PROBE}")
        with connection.schema_editor() as editor:
            for model in models:
                editor.create_model(model)
        built = catalog(PROBE)
        transaction.set_rollback(True)
    for kind in CATALOG:
        assert migrated[kind] == built[kind], kind
    names = {index.name for model in models for index in model._meta.indexes}
    assert names <= {name for _, name, _ in migrated["indexes"]}
    # flow: 3; workflows: axa_queue_workflow, _linked, axa_dependency_child, _pending; ops: 2; the failed
    # list: 1; the plain claim's walk over every name: axa_queue_claim_all and axa_queue_claim_all_queue.
    assert len(names) == 20


@pytest.mark.django_db
def test_the_migration_adds_the_notify_trigger_and_storage_parameters():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.tgname, p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
            "WHERE t.tgrelid = 'axa_queue'::regclass AND NOT t.tgisinternal"
        )
        triggers = cursor.fetchall()
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)", [list(TABLES)])
        options = dict(cursor.fetchall())
    assert sorted(triggers) == [
        ("axa_flow_delete", "axa_flow_count"),  # the per-key counts of limited jobs (0006)
        ("axa_flow_insert", "axa_flow_count_inserted"),
        ("axa_flow_truncate", "axa_flow_truncate"),
        ("axa_flow_update", "axa_flow_count"),
        ("axa_history_keep", "axa_history_keep"),  # a row finished in place moves to the history
        ("axa_queue_behind_insert", "axa_queue_behind"),  # rows queued behind the claims' floors (0005)
        ("axa_queue_behind_update", "axa_queue_behind"),
        ("axa_queue_notify", "axa_queue_notify"),
        ("axa_queue_requeue", "axa_queue_requeue"),  # live workers' jobs spared, a cancel kept
    ]
    assert sorted(options["axa_queue"]) == sorted(
        [
            "fillfactor=70",
            "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_vacuum_threshold=1000",
            "autovacuum_analyze_scale_factor=0.02",
            "autovacuum_vacuum_cost_delay=0",
        ]
    )
    assert options["axa_worker"] == ["fillfactor=50"]
    assert options["axa_schedule"] is None
