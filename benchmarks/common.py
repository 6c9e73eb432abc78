"""SQL on Django's default connection, for the benchmark code that runs inside Django."""

from __future__ import annotations

from typing import Any


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement on Django's default connection and return its rows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []
