"""Every fenced code block of README.md and docs/*.md is run here, or checked by its shape with a reason.

A page's test opens `docs_examples.Page`, which fails unless the test ran every block of
the page not listed in SHAPE_ONLY or ELSEWHERE; ``test_every_block_is_accounted_for``
fails for a block of a page that has no test. So a block added later must be covered.
"""

from __future__ import annotations

import asyncio
import configparser
import datetime
import fnmatch
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
import uuid
from pathlib import Path
from typing import Any

import django
import pytest
import yaml
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.core import checks
from django.core.management import call_command, get_commands, load_command_class
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.test import override_settings
from django.utils import timezone

from axa_django import Job, background_job, signals
from axa_django.ops import searchindex
from axa_django.testing import run_jobs
from benchmarks import history, partitions, soak, statements
from benchmarks import run as benchmark
from tests import deploy_blocks, docs_examples
from tests.conftest import Workers

ROOT = docs_examples.ROOT

# Blocks that cannot run here, each with why; `test_shape_only_blocks` checks what it can.
SHAPE_ONLY: dict[tuple[str, str], str] = {
    ("README.md", "# 1. install and run the example site + worker (Ctrl-C to stop)"): (
        "creates a venv, installs, serves the demo until Ctrl-C, runs the whole suite; tests/test_example.py runs demo"
    ),
    (
        "README.md",
        "# not on PyPI yet: install from a checkout of this repository (a wheel built there: docs/install.md)",
    ): ("installs into the environment; tests/test_packaging.py runs it offline into a folder of its own"),
    ("docs/install.md", 'pip install "./axa-django[binary]"'): (
        "installs into the environment; tests/test_packaging.py runs both lines offline into folders of their own"
    ),
    (
        "docs/install.md",
        "pip install build && python -m build        # writes dist/axa_django-0.1.0-py3-none-any.whl and the sdist",
    ): ("builds and installs a wheel; tests/test_packaging.py builds it and runs the install line offline"),
    ("docs/install.md", 'python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest'): (
        "installs and runs the whole suite"
    ),
    ("docs/example.md", "python -m venv .venv && .venv/bin/pip install -e '.[dev]'"): (
        "installs and serves the demo until Ctrl-C; tests/test_example.py runs demo and demo --burst"
    ),
    ("docs/example.md", "$ python manage.py demo"): "a transcript of demo; tests/test_example.py checks its lines",
    (
        "docs/example.md",
        "$ python manage.py demo --burst",
    ): "a transcript of demo --burst; tests/test_example.py checks it",
    (
        "docs/upgrading.md",
        'pip install --upgrade "./axa-django[binary]"     # from the updated checkout',
    ): ("installs into the environment; the same line without --upgrade runs in tests/test_packaging.py"),
    (
        "docs/workers.md",
        "python manage.py runworker [--concurrency 4] [--prefetch N] [--poll-interval 1] [--burst] [--max-jobs N]",
    ): ("a synopsis; the forms it shows run from README.md, jobs.md and tasks.md"),
    ("docs/workers.md", "python manage.py runworker --queue emails:8 --queue default:4"): (
        "runs until stopped; tests/test_flow_pools.py runs per-queue pools as real subprocesses"
    ),
    ("docs/operations.md", "# settings.py (or wherever the process configures OpenTelemetry)"): (
        "sets the process-wide tracer provider and needs the OTLP exporter; tests/test_ops_tracing.py runs the same "
        "set-up (with the SDK's in-memory exporter) in a process of its own"
    ),
}
# Blocks run by other tests, and which.
ELSEWHERE: dict[tuple[str, str], str] = {
    ("docs/testing.md", "# shop/jobs.py"): "tests/test_testing_helpers*.py (docs_examples.run_block)",
    ("docs/testing.md", "# shop/services.py"): "tests/test_testing_helpers*.py (docs_examples.run_block)",
    ("docs/testing.md", "# shop/test_jobs.py"): "tests/test_testing_helpers.py collects its tests",
    ("docs/testing.md", "# shop/tests.py"): "tests/test_testing_helpers_testcase.py collects its tests",
    ("docs/testing.md", "# pyproject.toml: a suite whose warnings are errors, and a job that a Rust service runs"): (
        "tests/test_first_hour_traps.py applies its lines as pytest does, then enqueues what they name and one they do not"
    ),
    ("docs/deployment.md", "LOGGING = {"): "the LOGGING of tests/docs_settings.py, the README test's worker",
    ("docs/jobs.md", "from django.db import transaction"): "tests/test_exactly_once.py runs it on a real table",
    ("docs/jobs.md", "# shop/models.py"): "tests/test_references.py runs this pattern (tests/refapp/models.py)",
    ("docs/jobs.md", "# settings.py: a job a Rust service runs, and a queue that dedicated workers serve"): (
        "tests/test_first_hour_traps.py runs it, then enqueues that name and queue and one it leaves alone"
    ),
    ("docs/deployment.md", "# settings.py: a primary and its standby (Patroni, a managed service's two endpoints)"): (
        "tests/test_failover.py runs it against its URL form, and its workers fail over with that URL"
    ),
    ("docs/development.md", "axa_django/"): "tests/test_house_imports.py checks the tree against the package",
    **{
        ("docs/deployment.md", key): "tests/test_deployment_examples.py (tests/deploy_blocks.py names them)"
        for key in (
            deploy_blocks.PRODUCTION,
            deploy_blocks.LOGS,
            deploy_blocks.DOCKERFILE,
            deploy_blocks.COMPOSE,
            deploy_blocks.SECRET,
            deploy_blocks.KUBERNETES,
            deploy_blocks.QUEUE_SETTINGS,
            deploy_blocks.ROUTERS,
            deploy_blocks.MIGRATE_QUEUE,
            deploy_blocks.VIEWS,
        )
    },
}
# Pages with a test below; any other page's blocks must all be in SHAPE_ONLY or ELSEWHERE.
PAGE_TESTS = {
    "README.md",
    "docs/deployment.md",
    "docs/install.md",
    "docs/jobs.md",
    "docs/scheduling.md",
    "docs/tasks.md",
    "docs/admin.md",
    "docs/upgrading.md",
    "docs/performance.md",
    "docs/flow-control.md",
    "docs/workflows.md",
    "docs/operations.md",
}


def skipped(page: str) -> frozenset[str]:
    return frozenset(key for (p, key) in {**SHAPE_ONLY, **ELSEWHERE} if p == page)


def open_page(page: str, **options: Any) -> docs_examples.Page:
    return docs_examples.Page(page, skip=skipped(page), **options)


def test_every_block_is_accounted_for():
    blocks = {(block.page, block.key): block for block in docs_examples.all_blocks()}
    listed = {**SHAPE_ONLY, **ELSEWHERE}
    assert not set(listed) - set(blocks), "listed here but gone from the docs"
    assert not set(SHAPE_ONLY) & set(ELSEWHERE)
    uncovered = [key for key in blocks if key[0] not in PAGE_TESTS and key not in listed]
    assert not uncovered, "blocks of a page without a test: run them, or list them in SHAPE_ONLY with a reason"
    assert {"README.md", "docs/deployment.md", "docs/testing.md", "docs/admin.md"} <= {page for page, _ in blocks}


# -- shape: commands, pip extras, systemd, compose, Kubernetes -------------------------------


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _commands() -> set[str]:
    # demo belongs to the example project's app, which the test settings do not install.
    demo = {path.stem for path in ROOT.glob("example_project/*/management/commands/*.py")}
    return set(get_commands()) | demo


def _parser(command: str) -> Any:
    return load_command_class(get_commands()[command], command).create_parser("manage.py", command)


def _synopsis_argv(words: list[str]) -> list[str]:
    """``[--queue NAME ...]`` as arguments a parser can read: placeholders get sample values."""
    samples = {"NAME": "default", "N": "2", "SECONDS": "5"}
    return [samples.get(word, word) for word in (w.strip("[]") for w in words) if word and word != "..."]


def check_command(line: str) -> list[str]:
    """Check one shell command line; return its argv when it is ``python manage.py ...``."""
    words = shlex.split(line, comments=True)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words:
        return []
    program = Path(words[0]).name
    if program in ("python", "python3") and words[1:2] == ["manage.py"]:
        command = words[2]
        assert command in _commands(), f"no management command {command!r}: {line}"
        argv = _synopsis_argv(words[3:])
        if command in get_commands():
            _parser(command).parse_args(argv)  # exits 2 on an unknown option
        return ["manage.py", command, *argv]
    if program in ("python", "python3") and words[1:2] == ["benchmarks/run.py"]:
        argv = words[2 : words.index("|")] if "|" in words else words[2:]
        saved, sys.argv = sys.argv, ["run.py", *argv]
        try:
            benchmark.parse_args()  # exits 2 on an unknown option
        finally:
            sys.argv = saved
        return []
    if program in ("python", "python3") and words[1:2] == ["benchmarks/soak.py"]:
        soak.parse_args(words[2 : words.index("|")] if "|" in words else words[2:])  # exits 2 on a bad option
        return []
    if program in ("python", "python3") and words[1:2] == ["benchmarks/partitions.py"]:
        partitions.parse_args(words[2:])  # exits 2 on a bad option
        return []
    if program in ("python", "python3") and words[1:2] == ["benchmarks/statements.py"]:
        statements.parse_args(words[2:])  # exits 2 on a bad option
        return []
    if program in ("python", "python3") and words[1:2] == ["benchmarks/history.py"]:
        history.parse_args(words[2:])  # exits 2 on a bad option
        return []
    if program in ("python", "python3") and words[1] == "-m":
        assert importlib.util.find_spec(words[2]) is not None, f"no module {words[2]}: {line}"
        if words[2] == "venv":
            return []
    elif program == "pip" and words[1] == "install":
        for requirement in words[2:]:
            for extras in re.findall(r"\[([\w,]+)\]", requirement):
                assert set(extras.split(",")) <= _extras(), f"unknown extra in {requirement}"
            wheel = re.search(r"axa_django-([\d.]+)-py3-none-any\.whl", requirement)
            if wheel:
                assert wheel.group(1) == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    elif program == "git":
        assert words[1] == "clone"
    else:
        raise AssertionError(f"a command this test does not know: {line}")
    return []


def check_shell(code: str) -> list[list[str]]:
    """Check each command of a shell block (``$ `` prompts, ``&&``, continued synopses); return manage.py argvs."""
    commands: list[str] = []
    for line in code.splitlines():
        if commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1].rstrip() + " " + line.strip()  # a line continued with a backslash
        elif line.startswith(" ") and commands:
            commands[-1] += " " + line.strip()  # a synopsis carried on to the next line
        elif line.startswith("$ ") or not line.startswith(("demo:", "…", "^C", "NAME ", "shop.")):
            commands.extend(part for part in line.removeprefix("$ ").split("&&"))
    return [argv for command in commands if (argv := check_command(command))]


def runworker_argv(argv: list[str]) -> list[str]:
    """A runworker line's options, parsed as the command reads them."""
    assert argv[:2] == ["manage.py", "runworker"], argv
    options = _parser("runworker").parse_args(argv[2:])
    return [*argv[2:], *([] if options.burst else ["--burst"])]


def _grace(command: list[str]) -> float:
    return float(command[command.index("--grace-period") + 1])


def parse_yaml(text: str) -> Any:
    """A YAML block as compose, kubectl and Prometheus read it (PyYAML, the dev extra)."""
    return yaml.safe_load(text)


@pytest.mark.parametrize("key", sorted(SHAPE_ONLY), ids=lambda key: f"{key[0]}:{key[1][:40]}")
def test_shape_only_blocks(key):
    page, first = key
    block = next(b for b in docs_examples.page_blocks(page) if b.key == first)
    if block.lang in ("sh", ""):
        check_shell(block.code)
        if block.lang == "":
            summary = re.search(r"^demo: .* completed, .*$", block.code, re.M)
            assert summary is None or re.search(r"demo: \d+ jobs, \d+ completed, \d+ failed in [\d.]+s", block.code)
    elif block.lang == "python":
        compile(block.code, page, "exec")  # at least it parses
    elif block.lang == "text" and page == "docs/performance.md":
        assert re.match(r"server: PostgreSQL \d+", block.code), block.code
    else:
        raise AssertionError(f"no shape check for {block.lang!r} blocks")


# -- helpers for the pages that run ------------------------------------------------------


def assert_axa_settings_valid(namespace: dict[str, Any]) -> None:
    assert ... in namespace["INSTALLED_APPS"] and "axa_django" in namespace["INSTALLED_APPS"]
    with override_settings(AXA_DJANGO=namespace["AXA_DJANGO"]):
        problems = [m for m in checks.run_checks(include_deployment_checks=False) if m.id.startswith("axa_django")]
    assert problems == []


def start_runworkers(workers: Workers, block: docs_examples.Block) -> list[subprocess.Popen[str]]:
    """Start each ``python manage.py runworker`` line of ``block`` with ``--burst``, in parallel."""
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "runworker", *runworker_argv(argv)],
            cwd=ROOT,
            env=workers.env(DJANGO_SETTINGS_MODULE="tests.docs_settings"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in check_shell(block.code)
    ]
    workers.procs.extend(procs)  # killed at teardown if a test fails first
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"{proc.args} did not exit:\n{out}") from None
        assert proc.returncode == 0, out
        outputs.append(out)
    return outputs


# -- README.md ---------------------------------------------------------------------------

README_WORKER = "python manage.py runworker [--concurrency 4] [--queue NAME ...] [--burst] [--grace-period SECONDS]"


@pytest.mark.django_db(transaction=True)
def test_readme_first_job_runs_in_a_worker(workers):
    with open_page("README.md") as page:
        assert_axa_settings_valid(page.settings("# settings.py"))
        [argv] = check_shell(page.block("python manage.py migrate").code)
        call_command(*argv[1:], verbosity=0)
        shop_jobs = page.module("# shop/jobs.py")
        assert shop_jobs.send_welcome.name == "shop.jobs.send_welcome"  # as its comment says
        namespace = page.run("# views.py")
        [job] = Job.objects.filter(name="shop.jobs.send_welcome")
        assert job.args == {"user_id": namespace["user"].pk}
        # The worker loads README's shop/jobs.py (tests/docsapp) and deployment.md's LOGGING.
        [out] = finish(start_runworkers(workers, page.block(README_WORKER)))
        job.refresh_from_db()
        assert job.status == "completed"
        assert len(re.findall(r"worker \S+ stopped after", out)) == 1, out  # logged once: the project's handler


# -- docs/install.md -----------------------------------------------------------------------


@pytest.mark.django_db
def test_install_page(tmp_path):
    with open_page("docs/install.md") as page:
        assert_axa_settings_valid(page.settings("# settings.py"))
        [argv] = check_shell(page.block("python manage.py migrate").code)
        call_command(*argv[1:], verbosity=0)
        # DATABASE_URL is set here (the suite's server), so database() starts nothing.
        entry = page.settings("# settings.py #2", BASE_DIR=tmp_path)["DATABASES"]["default"]
        assert not (tmp_path / ".pg").exists()
        assert (entry["ENGINE"], entry["HOST"], entry["PORT"]) == (
            "django.db.backends.postgresql",
            connection.settings_dict["HOST"],
            connection.settings_dict["PORT"],
        )


# -- docs/deployment.md --------------------------------------------------------------------

DEPLOY = "docs/deployment.md"
ENV_FILE = "# /etc/shop/env  (EnvironmentFile= of both units; readable by root only, it holds secrets)"
MIGRATE_UNIT = "# /etc/systemd/system/shop-migrate.service  (run once per deploy, below)"
WORKER_UNIT = "# /etc/systemd/system/shop-worker@.service  (systemctl enable --now shop-worker@1 shop-worker@2)"
DEPLOY_STEP = "systemctl start shop-migrate.service && systemctl restart 'shop-worker@*.service'"
NOT_MIGRATED = "CommandError: the queue tables do not exist in database 'shop': run python manage.py migrate first"
HALF_MIGRATED = (
    "CommandError: database 'shop' lacks migration(s) 0001_initial of axa_django, which this version needs: "
    "run python manage.py migrate first"
)


def systemd_unit(block: docs_examples.Block) -> tuple[str, configparser.ConfigParser]:
    """(the file name its first line gives, the unit read as systemd reads keys: case-sensitive, each once)."""
    first = re.fullmatch(r"# /etc/systemd/system/(\S+\.service)  \(.*\)", block.code.split("\n", 1)[0])
    assert first, block.code
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(block.code)
    return first.group(1), unit


def systemd_verify(units: dict[str, str], directory: Path) -> None:
    """``systemd-analyze verify`` the units (unknown keys, bad values), with paths this machine has."""
    if shutil.which("systemd-analyze") is None:
        return  # no systemd here: the configparser checks above still ran
    for name, text in units.items():
        text = text.replace("/srv/shop/.venv/bin/python", sys.executable).replace("/srv/shop", str(ROOT))
        (directory / name).write_text(text)
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(directory / name) for name in units)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # It exits 0 for unknown keys and bad values too, and says so on stderr.
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def probe_passes(command: list[str], path: str, health_file: Path) -> bool:
    """Run an exec probe as the kubelet would, the health file it names at ``health_file``."""
    argv = [word.replace(path, str(health_file)) for word in command]
    return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0


def check_health_file_probe(command: list[str], path: str, health_file: Path) -> None:
    """The probe passes on a fresh health file a real worker wrote, fails on a stale one and on none."""
    assert "jobhealth" not in " ".join(command)  # the whole queue's health: an alert, not a pod's probe
    assert health_file.exists() and probe_passes(command, path, health_file)
    fresh = health_file.stat().st_mtime
    os.utime(health_file, (fresh - 600, fresh - 600))
    assert not probe_passes(command, path, health_file)
    os.utime(health_file, (fresh, fresh))
    assert not probe_passes(command, path, health_file.with_name("never-written"))


def migrate_argv(command: list[str]) -> list[str]:
    """``python manage.py migrate ...`` (any python path), checked by migrate's own parser; without the python."""
    assert Path(command[0]).name == "python" and command[1:3] == ["manage.py", "migrate"], command
    _parser("migrate").parse_args(command[3:])
    return command[1:]


@pytest.mark.django_db(transaction=True)
def test_deployment_page(workers, tmp_path):
    with open_page(DEPLOY) as page:
        # systemd: a migrate unit and a worker template, reading one environment file.
        env_file = page.block(ENV_FILE).code.splitlines()
        variables = dict(line.split("=", 1) for line in env_file[1:])
        assert set(variables) == {"DJANGO_SETTINGS_MODULE", "DATABASE_URL", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"}
        codes = {}
        units = {}
        for key in (MIGRATE_UNIT, WORKER_UNIT):
            name, unit = systemd_unit(page.block(key))
            codes[name], units[name] = page.block(key).code, unit
        migrate, worker = units["shop-migrate.service"], units["shop-worker@.service"]
        for unit in (migrate, worker):
            assert unit["Service"]["EnvironmentFile"] == env_file[0].split()[1]
            assert unit["Service"]["User"] == migrate["Service"]["User"] == "shop"
            assert unit["Service"]["WorkingDirectory"] == "/srv/shop"
            assert "network-online.target" in unit["Unit"]["Wants"].split()
            assert "network-online.target" in unit["Unit"]["After"].split()
        assert migrate["Service"]["Type"] == "oneshot" and "Install" not in migrate  # run by the deploy step only
        assert migrate_argv(shlex.split(migrate["Service"]["ExecStart"])) == ["manage.py", "migrate", "--noinput"]
        service = worker["Service"]
        command = shlex.split(service["ExecStart"])
        runworker_argv(command[1:])
        assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "always"
        assert float(service["TimeoutStopSec"]) > _grace(command)
        assert "%i" in worker["Unit"]["Description"] and "shop-migrate.service" in worker["Unit"]["After"].split()
        systemd_verify(codes, tmp_path)
        [start, restart] = [shlex.split(part) for part in page.block(DEPLOY_STEP).code.strip().split("&&")]
        assert start == ["systemctl", "start", "shop-migrate.service"]
        assert restart[:2] == ["systemctl", "restart"] and fnmatch.fnmatch("shop-worker@2.service", restart[2])

        # A worker on a database migrate never ran exits 2 saying so, and the unit does not restart it;
        # the Kubernetes init container's migrate --check fails there until migrate has run.
        assert service["RestartPreventExitStatus"] == "2"
        name = f"axa_unmigrated_{uuid.uuid4().hex[:10]}"
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        try:
            env = workers.env()
            env["DATABASE_URL"] = env["DATABASE_URL"].replace(f"/{connection.settings_dict['NAME']}", f"/{name}")
            proc = workers.start("--burst", env=env)
            check = subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--check"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                timeout=60,
            )
            assert check.returncode == 1
            assert proc.wait(timeout=60) == 2
            assert NOT_MIGRATED.replace("'shop'", repr(name)) in proc.stdout.read().splitlines()
            page.block(NOT_MIGRATED)
            page.block(HALF_MIGRATED)  # the same message, checked on a real worker by tests/test_half_migrated.py
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")


# -- docs/jobs.md ---------------------------------------------------------------------------


class Metrics:
    """The page's "your metrics client"."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float, dict[str, str]]] = []

    def histogram(self, name: str, value: float, tags: dict[str, str]) -> None:
        self.seen.append((name, value, tags))


@pytest.mark.django_db
def test_jobs_page(workers, capsys):
    written: list[str] = []

    async def fetch_all(url: str) -> int:
        await asyncio.sleep(0)
        return len(url)

    async def close_connections() -> None: ...

    context = {
        "background_job": background_job,  # the snippets continue a jobs.py
        "order": types.SimpleNamespace(pk=7),
        "chunks": lambda report_id: [f"{report_id}:{i}" for i in range(3)],
        "write": written.append,
        "fetch_all": fetch_all,
        "close_connections": close_connections,
        "metrics": Metrics(),
    }
    with open_page("docs/jobs.md") as page:
        jobs = page.module("# shop/jobs.py")
        assert jobs.send_welcome.name == "shop.jobs.send_welcome" and jobs.count.name == "CountWorker"
        ns = page.run("# views.py", **context)
        assert ns["job"].args == {"user_id": ns["user"].pk}
        assert Job.objects.filter(name="shop.jobs.send_welcome").count() == 5
        assert Job.objects.get(name="CountWorker").args == {"fail": False}
        ns = page.run('@background_job(queue="emails", priority=10)')
        procs = start_runworkers(
            workers, page.block("python manage.py runworker --queue emails                 # only the emails queue")
        )
        ns = page.run("from datetime import timedelta")
        receipts = Job.objects.filter(name=ns["send_receipt"].name).order_by("created_at", "id")
        assert [(j.priority, j.queue, j.args) for j in receipts][:2] == [
            (100, "emails", {"order_id": 7}),
            (10, "bulk", {"order_id": 7}),
        ]
        assert all(j.run_at > timezone.now() for j in receipts[2:])
        ns = page.run('@background_job(unique=lambda user_id: f"user:{user_id}")')
        assert ns["a"].id == ns["b"].id and ns["jobs"].skipped == 1
        assert f"already queued {ns['a'].id}" in capsys.readouterr().out
        ns = page.run("from axa_django import Job")
        ns["job"].refresh_from_db()
        assert ns["job"].status == "cancelled"
        ns = page.run("from axa_django import JobCancelled, JobContext, background_job")
        ns["export"].perform_later(3)
        ns = page.run("import asyncio")
        ns["crawl"].perform_later("https://example.com")
        ns = page.run("@background_job")
        attempts = {a.name: a for a in run_jobs()}  # once a worker has run it:
        assert attempts[ns["export"].name].result == {"done": True} and written == ["3:0", "3:1", "3:2"]
        assert attempts[ns["crawl"].name].result == len("https://example.com")
        ns = page.run("job.refresh_from_db()")
        assert (ns["job"].status, ns["job"].result) == ("completed", 5)
        ns = page.run("# shop/apps.py, in ready()")
        try:
            ns["add"].perform_later(1, 1)
            run_jobs()
        finally:
            # The page's receivers are global: they must not outlive its test.
            signals.job_enqueued.disconnect(ns["on_enqueued"])
            signals.job_started.disconnect(ns["on_started"])
            signals.job_finished.disconnect(ns["on_finished"])
        assert [(name, tags) for name, _, tags in context["metrics"].seen] == [
            ("job.duration", {"job": ns["add"].name, "status": "completed"})
        ]
        ns = page.run('@background_job(max_attempts=5)  # default: AXA_DJANGO["MAX_ATTEMPTS"] (1)')
        assert ns["sync_crm"].max_attempts == 5 and ns["charge"].retry_delay(2) == 60
        ns = page.run(
            '@background_job(max_losses=1)  # default: AXA_DJANGO["MAX_LOSSES"] (3); per call: .using(max_losses=...)'
        )
        report = ns["render_huge_report"]
        assert report.options.max_losses == 1 and report.perform_later(3).max_losses == 1
        assert report.using(max_losses=5).perform_later(4).max_losses == 5
        finish(procs)


# -- docs/scheduling.md --------------------------------------------------------------------

_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00")


@pytest.mark.django_db(transaction=True)  # prunejobs runs one transaction per batch
def test_scheduling_page():
    with open_page("docs/scheduling.md", snippet_module="shop.jobs") as page:
        page.run('@background_job(cron="*/15 * * * *")  # every 15 minutes', background_job=background_job)
        shown = page.block("$ python manage.py listjobs").code.splitlines()
        check_shell(shown[0])
        out = io.StringIO()
        call_command("listjobs", stdout=out)
        assert _ISO.sub("T", out.getvalue()).splitlines() == _ISO.sub("T", "\n".join(shown[1:])).splitlines()
        runs = page.run("from axa_django.cron import next_runs")["next_runs"](page.namespace["refresh_rates"], 3)
        assert len(runs) == 3 and all(run.tzinfo is not None and run.minute % 15 == 0 for run in runs)
        old = Job.objects.create(name="CountWorker", args={"fail": False}, status="failed")
        forty_days_ago = timezone.now() - datetime.timedelta(days=40)
        Job.objects.filter(pk=old.pk).update(created_at=forty_days_ago, updated_at=forty_days_ago)
        for argv in check_shell(
            page.block(
                "python manage.py prunejobs --older-than 7d                     # completed, failed and cancelled"
            ).code
        ):
            call_command(*argv[1:], stdout=io.StringIO())
        assert not Job.objects.filter(pk=old.pk).exists()


# -- docs/tasks.md ---------------------------------------------------------------------------


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks exists from Django 6.0")
@pytest.mark.django_db
def test_tasks_page(workers, monkeypatch):
    from django.tasks import TaskResultStatus, task_backends

    from axa_django.backends import QueueBackend

    async def fetch_profile(email: str) -> dict:
        return {"email": email}

    saved: list[tuple[User, dict]] = []
    httpx = types.ModuleType("httpx")  # the page's HTTP client, not installed here
    monkeypatch.setitem(sys.modules, "httpx", httpx)
    with open_page("docs/tasks.md") as page:
        tasks_settings = page.settings("# settings.py")
        with override_settings(TASKS=tasks_settings["TASKS"]):
            backend = task_backends["default"]
            assert isinstance(backend, QueueBackend) and (backend.max_attempts, backend.backoff) == (3, 10.0)
            assert [m for m in checks.run_checks() if m.id.startswith("axa_django")] == []
        page.module("# myapp/tasks.py")
        ns = page.run("from myapp.tasks import add")
        assert ns["result"].status == TaskResultStatus.READY
        procs = start_runworkers(
            workers, page.block("python manage.py runworker             # runs background jobs and tasks")
        )
        run_jobs()
        ns = page.run("result = add.get_result(result.id)  # from any process: the id is a str")
        assert (ns["result"].status, ns["result"].return_value) == (TaskResultStatus.SUCCESSFUL, 5)
        page.module("# myapp/jobs.py")
        views = page.module("# myapp/views.py")
        async_to_sync(views.view)(None)
        assert Job.objects.filter(name="myapp.jobs.fetch").exists()
        assert Job.objects.filter(name="myapp.jobs.ping").exists()
        ns = page.run(
            "from asgiref.sync import sync_to_async",
            background_job=background_job,
            fetch_profile=fetch_profile,
            save_profile=lambda user, profile: saved.append((user, profile)),
        )
        user = User.objects.create(username="bea", email="bea@example.com")
        ns["refresh"].perform_later(user.pk)
        run_jobs(ns["refresh"].name)
        assert saved == [(user, {"email": "bea@example.com"})]
        finish(procs)


# -- docs/admin.md ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_page_search_migrations():
    with open_page("docs/admin.md") as page:
        graph = MigrationLoader(connection).graph
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")  # TrigramExtension(); rolled back with the test
            cursor.execute(searchindex.TABLES)
            tables = sorted(table for table, _ in cursor.fetchall())
        for key, indexes in (
            ("# yourapp/migrations/0002_axa_args_search.py", (searchindex.ARGS,)),
            ("# yourapp/migrations/0002_axa_trigram_search.py", searchindex.TRIGRAMS),
        ):
            migration = page.module(key).Migration
            assert migration.atomic is False
            [(app, name)] = [d for d in migration.dependencies if d[0] == "axa_django"]
            assert (app, name) in graph.nodes, f"docs/admin.md's migration depends on {name}, which axa_django lacks"
            run = migration.operations[-1]
            # In the test's transaction the indexes are built plainly (CONCURRENTLY needs none).
            with connection.schema_editor() as editor, connection.cursor() as cursor:
                run.code(None, editor)
                assert searchindex.missing(cursor, *indexes) == []
                run.reverse_code(None, editor)
                assert searchindex.missing(cursor, *indexes) == tables


# -- docs/upgrading.md -----------------------------------------------------------------------


@pytest.mark.django_db
def test_upgrading_page():
    with open_page("docs/upgrading.md") as page:
        out = io.StringIO()
        for argv in check_shell(page.block("python manage.py migrate --plan    # what will run").code):
            call_command(*argv[1:], stdout=out, verbosity=1)
        assert out.getvalue().splitlines()[:2] == ["Planned operations:", "  No planned migration operations."]


def test_performance_page():
    # Benchmarks take minutes and install the peers: their command lines are parsed by
    # run.py's own parser, and the sample header must look like the one run.py prints.
    with open_page("docs/performance.md") as page:
        for block in docs_examples.page_blocks("docs/performance.md"):
            checked = page.block(block.key)
            if checked.lang == "sh":
                check_shell(checked.code)
            else:
                assert checked.lang == "text" and re.match(r"server: PostgreSQL \d+", checked.code), checked.code


@pytest.mark.django_db(transaction=True)
def test_flow_control_page():
    from axa_django.models import QueuePause
    from axa_django.worker import Worker

    with open_page("docs/flow-control.md") as page:
        jobs = page.module("# shop/jobs.py")
        assert (jobs.render_invoice.options.timeout, jobs.sync_account.concurrency) == (30, 1)
        assert (jobs.rebuild_search_index.concurrency, jobs.call_partner.rate.text) == (2, "10/s")
        assert jobs.call_partner.perform_later("k1", {}).rate_key == "k1"
        ns = page.run("from shop.jobs import sync_account")
        assert ns["job"].concurrency_key == "acct:vip"
        ping = jobs.ping.perform_later("db")
        Worker(names=[jobs.ping.name], burst=True, install_signals=False).run()
        ping.refresh_from_db()
        assert ping.status == "completed" and ping.result.startswith("db until 20")
        ns = page.run("from axa_django import queues")
        assert not QueuePause.objects.exists()
        out = io.StringIO()
        for argv in check_shell(
            page.block(
                "python manage.py queues                                      # queues: ready, running, paused, limits"
            ).code
        ):
            call_command(*argv[1:], stdout=out)
        text = out.getvalue()
        assert "queue 'emails' paused" in text and "queue 'emails' resumed" in text and "QUEUE" in text
        ns = page.run("from axa_django import queues #2")
        assert ns["queues"].limits() == {}  # set, read back and lifted
        out = io.StringIO()
        limit_block = page.block(
            "python manage.py queues limit reports 4      "
            "# queue 'reports': at most 4 running across all workers (was: no limit)"
        )
        for argv in check_shell(limit_block.code):
            call_command(*argv[1:], stdout=out)
        assert out.getvalue().splitlines() == [
            "queue 'reports': at most 4 running across all workers (was: no limit)",
            "queue 'reports': no limit across all workers (was: at most 4 running)",
        ]


# -- docs/workflows.md ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_workflows_page():
    import builtins

    from axa_django import registry, workflows
    from axa_django.models import Dependency, Workflow

    orders = [types.SimpleNamespace(pk=pk) for pk in (1, 2, 3)]
    with open_page("docs/workflows.md") as page:
        # The page's registry starts empty; every process has the batch callback job.
        registry.registry[workflows.CALLBACK] = workflows.batch_callback
        jobs = page.module("# shop/jobs.py")
        # The page's 10,000 rows, cut to 30 here: tests/test_workflows_fanin.py runs 10,000 on real workers.
        ns = page.run(
            "from shop.jobs import email_summary, import_file, process_row",
            path="/data/rows.csv",
            range=lambda n: builtins.range(min(n, 30)),
        )
        assert ns["summary"].status == "waiting" and len(ns["row_jobs"]) == 30
        assert Dependency.objects.filter(child_id=ns["summary"].pk).count() == 30
        ns = page.run("from axa_django import workflow", u="https://example.com/feed")
        assert [job.status for job in (ns["a"], ns["b"], ns["c"])] == ["queued", "waiting", "waiting"]
        ns = page.run("from axa_django import batch", orders=orders)
        assert Workflow.objects.get(pk=ns["b"].id).kind == "batch"
        run_jobs()
        summary = Job.objects.get(pk=ns["summary"].pk)
        assert (summary.status, summary.result) == ("completed", 30)
        assert set(Job.objects.values_list("status", flat=True)) == {"completed"}
        callback = Job.objects.get(name="axa_django.batch_callback", args__kind="complete")
        assert callback.queue == "reports" and callback.result["completed"] == 3
        assert Job.objects.get(name="axa_django.batch_callback", args__kind="failure").result["called"] is False
        ns = page.run("wf.cancel()  # every job of the group not yet finished")
        assert ns["wf"].workflow.counts()["completed"] == 3
        assert jobs.report.name == "shop.jobs.report"


# -- docs/operations.md ----------------------------------------------------------------------

OPS = "docs/operations.md"


def _jobhealth(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command(*argv[1:], stdout=out)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


def _metric_names() -> set[str]:
    from axa_django.ops import metrics

    return set(re.findall(r'"(axa_[a-z_]+)"', Path(metrics.__file__).read_text()))


@pytest.mark.django_db(transaction=True)
def test_operations_page(workers, tmp_path):
    from django.urls import reverse

    from axa_django import conf as axa_conf
    from axa_django.ops import fleetstats
    from axa_django.ops import metrics as prometheus
    from benchmarks import dashboard as dashboard_benchmark

    with open_page(OPS) as page:
        # Probes: jobs waiting in a queue no worker serves, as the sample shows.
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, queue, run_at) SELECT gen_random_uuid(), 'shop.jobs.send', "
                "'{}', 'emails', now() - interval '412 seconds' FROM generate_series(1, 3)"
            )
        first, second = check_shell(
            page.block("python manage.py jobhealth --max-ready-age 300 --require-workers 2").code
        )
        code, out = _jobhealth(first)
        assert code == 1 and "unhealthy: 0 live worker(s), fewer than --require-workers 2" in out
        code, out = _jobhealth(second)
        assert code == 1 and json.loads(out)["figures"]["queues"][0]["ready"] == 3
        sample = page.block("unhealthy: queue 'emails': 3 ready job(s) and no live worker claims from this queue").code
        code, out = _jobhealth(["manage.py", "jobhealth", "--max-ready-age", "300"])
        shape = [re.escape(line).replace("412\\.0s", r"[\d,.]+s") for line in sample.splitlines()]
        assert code == 1 and len(out.splitlines()) == len(shape)
        for pattern, line in zip(shape, out.splitlines(), strict=True):
            assert re.fullmatch(pattern, line), (pattern, line)
        spec = parse_yaml(page.block("spec:").code)["spec"]
        [container] = spec["containers"]
        worker = runworker_argv(container["command"][1:])
        beat = worker[worker.index("--health-file") + 1]
        # Both probes are about this worker (its health file): run below on the file a worker writes.
        probes = [container[probe]["exec"]["command"] for probe in ("livenessProbe", "readinessProbe")]
        # Metrics: the URLs, the settings, the scrape config, the sample scrape, the alerts.
        urls = page.module("# urls.py")
        with override_settings(ROOT_URLCONF=urls):
            path = reverse("axa_django:metrics")
            assert path == "/jobs/metrics" and reverse("axa_django:dashboard-data") == "/jobs/dashboard.json"
        settings = page.settings("# settings.py")["AXA_DJANGO"]
        assert axa_conf.problems(settings) == []
        scrape = parse_yaml(page.block("# prometheus.yml").code)["scrape_configs"][0]
        assert scrape["metrics_path"] == path and scrape["authorization"]["credentials"] == settings["METRICS_TOKEN"]
        text = page.block(
            "# HELP axa_jobs Jobs in axa_queue by status (estimated from the planner's statistics when large)"
        ).code
        known = _metric_names()
        lines = re.finditer(r"^(axa_\w+)(\{[^}]*\})? ", text, re.M)
        shown = {m.group(1): set(re.findall(r'(\w+)="', m.group(2) or "")) for m in lines}
        assert set(shown) == known, set(shown) ^ known
        if prometheus.available():
            from prometheus_client.parser import text_string_to_metric_families

            real = prometheus.exposition(fleetstats.collect())[0].decode()
            families = {f.name: f for f in text_string_to_metric_families(real)}
            sample_families = {f.name: f for f in text_string_to_metric_families(text)}
            for name, family in sample_families.items():
                labels = {frozenset(s.labels) for s in family.samples}
                real_labels = {frozenset(s.labels) for s in families[name].samples}
                assert not real_labels or labels <= real_labels, name  # a family with no sample (no worker) aside
                assert family.documentation in ("", families[name].documentation), name
        for rule in parse_yaml(page.block("# alerts.yml").code)["groups"][0]["rules"]:
            assert set(re.findall(r"axa_[a-z_]+", rule["expr"])) <= known, rule
        # The dashboard's benchmark line parses as the script reads it.
        [line] = page.block(
            "python benchmarks/dashboard.py --url postgresql://postgres:postgres@127.0.0.1:5432/postgres --rows 1000000"
        ).code.splitlines()
        options = dashboard_benchmark.parse_args(shlex.split(line)[2:])
        assert options.rows == 1_000_000
        # Sizing: the start line a worker of --concurrency 8 prints, and the database check.
        health_file = tmp_path / "alive"
        proc = workers.start(
            "--burst", "--concurrency", "8", "--health-file", str(health_file), env=workers.env(AXA_LOG_LEVEL="INFO")
        )
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        for probe in probes:
            check_health_file_probe(probe, beat, health_file)
        said = page.block(
            "this worker holds up to 13 database connections: 4 of its own (dispatcher, heartbeat, finisher, listener), one per job thread (8) while its jobs use the database, and 1 for periodic jobs and pruning; size max_connections for every worker (python manage.py check --database default warns when they do not fit)"
        ).code
        assert said.strip() in proc.stdout.read()
        [argv] = check_shell(page.block("python manage.py check --database default").code)
        call_command(*argv[1:], stdout=io.StringIO(), stderr=io.StringIO())
