"""Django's flush, cheaper between the suite's transactional tests.

pytest-django empties the tables after every transactional test with ``flush``, which
TRUNCATEs them all: on axa_queue that makes new files for the table, its history tables
and their ~40 indexes, every test, even when the test left three rows (measured: 40 ms
alone, 140 ms a test with three test processes on two cores, a fifth of the suite's
time). Here tables left with at most SMALL rows, and no bigger than fresh ones, are emptied by DELETE, with triggers
and foreign key checks off (``session_replication_role``) as TRUNCATE has them, and
axa_queue's TRUNCATE trigger's work done by hand; past SMALL rows anywhere, or without
the right to set the role, Django's own flush runs. ``manage.py flush`` typed by a person
(interactive, or resetting sequences) is Django's, unchanged.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.core.management.sql import emit_post_migrate_signal
from django.db import DatabaseError, connections, transaction

SMALL = 1000
# What axa_queue's TRUNCATE trigger (axa_flow_truncate) empties: the per-key counts.
QUEUE_TRUNCATE_EMPTIES = ("axa_flow_delta", "axa_flow_key")


# The tables to empty: Django's, and with CASCADE (as pytest-django asks when a test names
# its available_apps) every table whose foreign keys point at them, as TRUNCATE ... CASCADE
# empties them; as regclass text, quoted where a name needs it.
TABLES = """
WITH RECURSIVE t(oid) AS (
    SELECT unnest(%(tables)s::regclass[])
    UNION
    SELECT c.conrelid FROM pg_constraint c JOIN t ON c.confrelid = t.oid
    WHERE c.contype = 'f' AND %(cascade)s
)
SELECT oid::regclass::text FROM t
"""


# Whether a table (with its inheritance children) or one of its indexes grew past a fresh
# one's pages: DELETE keeps the pages, and plans on the next tests' few rows (the suite
# asserts plans) then weigh indexes of other sizes than a fresh table's; TRUNCATE makes
# them new. A fresh B-tree is 2 pages (its metapage and root).
GROWN = """
WITH RECURSIVE t(oid) AS (
    SELECT unnest(%(tables)s::regclass[])
    UNION
    SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.oid
)
SELECT EXISTS (SELECT FROM t WHERE pg_relation_size(t.oid) > 8 * 8192)
    OR EXISTS (SELECT FROM pg_index i JOIN t ON i.indrelid = t.oid WHERE pg_relation_size(i.indexrelid) > 2 * 8192)
"""


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        database = options["database"]
        typed = options["interactive"] or options.get("reset_sequences", True)
        if typed or not self._emptied(database, bool(options.get("allow_cascade", False))):
            super().handle(**options)
        elif not options.get("inhibit_post_migrate", False):
            emit_post_migrate_signal(options["verbosity"], False, database)

    def _emptied(self, database: str, cascade: bool) -> bool:
        """Empty the tables by DELETE if each holds at most SMALL rows; False if not done."""
        connection = connections[database]
        names = connection.introspection.django_table_names(only_existing=True, include_views=False)
        if not names:
            return True
        quote = connection.ops.quote_name
        try:
            with transaction.atomic(using=database), connection.cursor() as cursor:
                cursor.execute(TABLES, {"tables": [quote(name) for name in names], "cascade": cascade})
                tables = [row[0] for row in cursor.fetchall()]
                counts = ", ".join(f"(SELECT count(*) FROM (SELECT FROM {t} LIMIT {SMALL + 1}) s)" for t in tables)
                cursor.execute(f"SELECT {counts}")
                sizes = dict(zip(tables, cursor.fetchone(), strict=True))
                if any(size > SMALL for size in sizes.values()):
                    return False
                cursor.execute(GROWN, {"tables": tables})
                if cursor.fetchone()[0]:
                    return False
                cursor.execute("SET LOCAL session_replication_role = replica")
                for table, size in sizes.items():
                    if size:
                        cursor.execute(f"DELETE FROM {table}")
                if "axa_queue" in sizes:
                    for table in QUEUE_TRUNCATE_EMPTIES:
                        cursor.execute(f"DELETE FROM {table}")
        except DatabaseError:
            return False
        return True
