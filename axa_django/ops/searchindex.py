"""The admin search's opt-in indexes, on ``axa_queue`` and every history table under it.

An index on ``axa_queue`` does not cover the tables that inherit it (the history,
axa_django/history.py), so each table needs its own. ``axa_history_make`` copies
``axa_queue``'s indexes into every history table made later: an index made here on
``axa_queue`` reaches the tables a rotation makes, and these functions add it to the
tables that exist already. Users call them from a migration of their own (the index
costs space and a write on every enqueue and every finish), with ``atomic = False``
so that each index is built CONCURRENTLY, without blocking the queue's writes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db.backends.utils import truncate_name


@dataclass(frozen=True)
class SearchIndex:
    """One index as ``axa_queue`` holds it, its definition, and the pattern pg_get_indexdef shows."""

    name: str  # on axa_queue; history tables get axa_history_<number> + what follows "axa_queue"
    using: str
    shows: str  # a regular expression on pg_get_indexdef's text

    def on(self, table: str, number: int | None) -> str:
        """The index's name on ``table``: the one ``axa_history_make`` would give it."""
        if table == "axa_queue":
            return self.name
        suffix = self.name.removeprefix("axa_queue")
        return truncate_name(f"axa_history_{number}{suffix}" if number is not None else f"{table}{suffix}", 63)


# args @> '{"user_id": 42}': jsonb_path_ops is the smaller GIN and serves containment
# (all the search asks); a user's own GIN over args with the default jsonb_ops serves it too.
ARGS = SearchIndex("axa_queue_args_path", "gin (args jsonb_path_ops)", r"USING gin \(args( jsonb_path_ops)?\)")
# The text search's UPPER(column::text) LIKE UPPER('%term%'): trigrams of those expressions.
NAME_TRIGRAM = SearchIndex("axa_queue_name_trgm", "gin ((upper(name)) gin_trgm_ops)", r"USING gin \(upper\(name\) ")
ARGS_TRIGRAM = SearchIndex(
    "axa_queue_args_trgm", "gin ((upper(args::text)) gin_trgm_ops)", r"USING gin \(upper\(\(args\)::text\) "
)
ERROR_TRIGRAM = SearchIndex(
    "axa_queue_error_trgm", "gin ((upper(error::text)) gin_trgm_ops)", r"USING gin \(upper\(error\) "
)
TRIGRAMS = (NAME_TRIGRAM, ARGS_TRIGRAM, ERROR_TRIGRAM)

# axa_queue and every table that inherits it, each with its history number (None for
# axa_queue and for a table axa_history_part does not list), read as they are named now.
TABLES = """
SELECT c.relname::text,
       (SELECT p.number FROM axa_history_part p
        WHERE c.relname = CASE WHEN p.opened_at IS NULL THEN 'axa_history_next'
                               WHEN p.closed_at IS NULL THEN 'axa_history'
                               ELSE 'axa_history_' || p.number END)
FROM pg_class c
WHERE c.oid = 'axa_queue'::regclass
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass)
ORDER BY c.oid <> 'axa_queue'::regclass, c.relname
"""
# A valid whole-table GIN index of ``table`` whose definition shows ``pattern`` (a partial index
# serves no search); only GIN indexes are deparsed.
LIKE = """
SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
WHERE i.indrelid = {table} AND a.amname = 'gin' AND i.indisvalid AND i.indpred IS NULL
  AND pg_get_indexdef(i.indexrelid) ~ {pattern}
"""
HAS = f"SELECT EXISTS ({LIKE.format(table='%s::regclass', pattern='%s')})"
INVALID = "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass(%s) AND NOT indisvalid)"
# The tables of axa_queue's tree that lack one of the patterns: the catalog, no rows.
MISSING = f"""
SELECT t.oid::regclass::text FROM
    (SELECT 'axa_queue'::regclass::oid UNION ALL
     SELECT inhrelid FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass) AS t(oid),
    unnest(%s::text[]) AS p(pattern)
WHERE NOT EXISTS ({LIKE.format(table="t.oid", pattern="p.pattern")})
GROUP BY 1 ORDER BY 1
"""


def missing(cursor: Any, *indexes: SearchIndex) -> list[str]:
    """The tables of ``axa_queue``'s tree lacking one of ``indexes`` (a search reads them whole)."""
    cursor.execute(MISSING, [[index.shows for index in indexes]])
    return [row[0] for row in cursor.fetchall()]


def create(schema_editor: Any, *indexes: SearchIndex) -> list[str]:
    """Build ``indexes`` on axa_queue, then on each table under it that lacks one; return the names built.

    axa_queue first: a history table made meanwhile copies it from there. CONCURRENTLY
    outside a transaction (a migration with ``atomic = False``), else plainly.
    """
    concurrently = "" if schema_editor.connection.in_atomic_block else " CONCURRENTLY"
    built = []
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TABLES)
        for table, number in cursor.fetchall():
            for index in indexes:
                cursor.execute(HAS, [table, index.shows])
                if cursor.fetchone()[0]:
                    continue
                name = index.on(table, number)
                # Left invalid by a build that failed (a CONCURRENTLY one interrupted): made again.
                cursor.execute(INVALID, [name])
                if cursor.fetchone()[0]:
                    cursor.execute(f"DROP INDEX{concurrently} {_quoted(name)}")
                cursor.execute(f"CREATE INDEX{concurrently} {_quoted(name)} ON {_quoted(table)} USING {index.using}")
                built.append(name)
    return built


def drop(schema_editor: Any, *indexes: SearchIndex) -> list[str]:
    """Drop every index like ``indexes`` on axa_queue and the tables under it; return the names dropped."""
    concurrently = "" if schema_editor.connection.in_atomic_block else " CONCURRENTLY"
    dropped = []
    with schema_editor.connection.cursor() as cursor:
        for index in indexes:
            cursor.execute(
                "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE (i.indrelid = 'axa_queue'::regclass OR i.indrelid IN "
                "       (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'axa_queue'::regclass)) "
                "  AND pg_get_indexdef(i.indexrelid) ~ %s ORDER BY 1",
                [index.shows],
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f"DROP INDEX{concurrently} IF EXISTS {_quoted(name)}")
                dropped.append(name)
    return dropped


def add_args_index(apps: Any, schema_editor: Any) -> None:
    """A migration's RunPython: the GIN index that answers ``args.key:value`` searches."""
    create(schema_editor, ARGS)


def remove_args_index(apps: Any, schema_editor: Any) -> None:
    """The reverse of ``add_args_index``."""
    drop(schema_editor, ARGS)


def add_trigram_indexes(apps: Any, schema_editor: Any) -> None:
    """A migration's RunPython (after TrigramExtension()): trigram indexes for text and ``error:`` searches."""
    create(schema_editor, *TRIGRAMS)


def remove_trigram_indexes(apps: Any, schema_editor: Any) -> None:
    """The reverse of ``add_trigram_indexes``."""
    drop(schema_editor, *TRIGRAMS)


def _quoted(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"not a plain table or index name: {name!r}")
    return f'"{name}"'
