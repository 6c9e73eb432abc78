"""Keep every migration on the PostgreSQL database."""

from typing import Any


class PostgresOnly:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"
