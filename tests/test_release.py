"""Release-ready: one version, the classifiers, the changelog's entry, and the built wheel in a fresh venv.

The fresh venv is the user's first hour: ``pip install`` of the wheel from the package index
(no checkout on the path), README's project set-up, ``migrate`` on an empty database, its
first job enqueued and run by ``runworker --burst``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

import axa_django
from tests import docs_examples
from tests.conftest import DIE_WITH_PARENT, ON_ITS_OWN_SERVER, ROOT, database_url
from tests.test_packaging import build_dist

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# What a connection to the package index that failed looks like in pip's output (a
# missing package on a reachable index is a failure of this project, not a skip).
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ConnectTimeoutError|ProxyError|No route to host"
)


def test_the_version_is_written_in_pyproject_only():
    assert axa_django.__version__ == PROJECT["version"] == importlib.metadata.version("axa-django")
    assert "version" not in PROJECT.get("dynamic", [])
    literals = []
    for path in sorted((ROOT / "axa_django").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == PROJECT["version"]:
                literals.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not literals, f"the version written again in the package: {literals}"


def test_the_classifiers_name_every_supported_django_and_python():
    classifiers = PROJECT["classifiers"]
    djangos = [c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: [\d.]+", c)]
    pythons = [
        c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert djangos == ["5.2", "6.0", "6.1"]
    assert pythons == ["3.11", "3.12", "3.13"]
    # The oldest of each is the floor the requirements set.
    assert "django>=5.2" in PROJECT["dependencies"] and PROJECT["requires-python"] == ">=3.11"
    for prefix in ("Development Status :: ", "Environment :: ", "Intended Audience :: ", "Operating System :: "):
        assert any(c.startswith(prefix) for c in classifiers), prefix
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert classifiers == sorted(classifiers)


def test_the_changelog_has_an_unreleased_section_then_an_entry_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Unreleased", headings[:3]
    assert re.fullmatch(rf"{re.escape(PROJECT['version'])} - (\d{{4}}-\d\d-\d\d|unreleased)", headings[1]), headings[1]
    assert "Keep a Changelog" in text.split("## Unreleased")[0] and "Semantic Versioning" in text


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv made with ``python -m venv``, holding only the wheel and what pip brought for it."""
    (wheel,) = build_dist(tmp_path_factory).glob("axa_django-*.whl")
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    # This pip installs into it (--python): installing pip into the venv first took 3 s of CPU.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # Few retries: without an index, pip would retry each request five times.
    install = [*_pip(venv), "install", "-q", "--retries", "1", "--timeout", "30", f"{wheel}[binary]"]
    installed = subprocess.run(install, capture_output=True, text=True, timeout=600, env=_clean_env())
    out = installed.stdout + installed.stderr
    if installed.returncode and _OFFLINE.search(out):
        pytest.skip(f"the package index is unreachable, so the wheel's dependencies cannot be installed: {out[-400:]}")
    assert installed.returncode == 0, out
    yield venv


def _pip(venv: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points into the checkout or the test settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _run(venv: Path, cwd: Path, env: dict[str, str], *argv: str, timeout: float = 120) -> str:
    """``python -m django ...`` (what manage.py runs) in the venv; it dies with this process."""
    command = [str(venv / "bin" / "python"), "-c", DIE_WITH_PARENT, str(os.getpid()), *argv]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def _readme(first_line: str) -> str:
    return next(b.code for b in docs_examples.page_blocks("README.md") if b.key == first_line)


@ON_ITS_OWN_SERVER  # README's bare machine: the legs with no DATABASE_URL
def test_the_wheel_installed_in_a_fresh_venv_runs_the_readme_first_job(fresh_venv, tmp_path, django_db_setup):
    python = fresh_venv / "bin" / "python"
    found = subprocess.run(
        [str(python), "-c", "import axa_django; print(axa_django.__version__, axa_django.__file__)"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    version, where = found.stdout.split()
    assert version == PROJECT["version"]
    assert Path(where).is_relative_to(fresh_venv), where  # the wheel's copy, not this checkout
    pip_check = subprocess.run([*_pip(fresh_venv), "check"], capture_output=True, text=True, timeout=60)
    assert pip_check.returncode == 0, pip_check.stdout

    # A database of its own on the test server: migrate runs from nothing, as in a new project.
    name = f"axa_release_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        url = urlsplit(database_url())._replace(path=f"/{name}").geturl()
        project = tmp_path / "project"
        project.mkdir()
        env = _clean_env(DATABASE_URL=url)
        # README: a project (startproject), an app for the jobs (startapp shop), its settings.
        _run(fresh_venv, project, env, "startproject", "mysite", ".")
        env["DJANGO_SETTINGS_MODULE"] = "mysite.settings"  # as manage.py sets it
        _run(fresh_venv, project, env, "startapp", "shop")
        settings = _readme("# settings.py").replace("[...,", '[*INSTALLED_APPS, "shop",')
        with (project / "mysite" / "settings.py").open("a") as file:
            file.write(f"\n{settings}\nfrom axa_django.devdb import database\n\n")
            file.write('DATABASES = {"default": database(BASE_DIR / ".pg")}\n')
        (project / "shop" / "jobs.py").write_text(_readme("# shop/jobs.py"))
        migrate = shlex.split(_readme("python manage.py migrate"))
        assert migrate[:2] == ["python", "manage.py"], migrate
        _run(fresh_venv, project, env, *migrate[2:])
        _run(fresh_venv, project, env, "shell", "-c", _readme("# views.py"))
        out = _run(fresh_venv, project, env, "runworker", "--burst", timeout=60)
        assert "UnreachableJobWarning" not in out, out
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT name, status, args FROM axa_queue").fetchall()
        assert rows == [("shop.jobs.send_welcome", "completed", {"user_id": 1})], out
    finally:
        with psycopg.connect(database_url(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_the_performance_page_stays_a_page_for_users() -> None:
    # Dated runs belong in benchmarks/HISTORY.md and results/; the page says what to expect.
    lines = (ROOT / "docs" / "performance.md").read_text().count("\n")
    assert lines < 300, f"docs/performance.md has {lines} lines: move dated figures to benchmarks/HISTORY.md"
