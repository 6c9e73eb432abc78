"""docs/deployment.md's examples, each run or validated as the tool that reads it would.

- the production settings, run with a made-up environment; their JSON log lines, from real workers;
- the Dockerfile, read instruction by instruction: its commands against the settings and the commands' parsers;
- compose.yaml: its worker command run as a real worker, whose healthcheck passes while it lives and
  fails once it has stopped;
- the Kubernetes Secret, Job and Deployment against the Kubernetes schemas, every container's
  environment from the Secret, the worker's command run with it;
- the queue on a database of its own, end to end on a second database of the test server.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import kubernetes_validate
import psycopg
import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import get_commands, load_command_class
from django.utils.module_loading import import_string

from axa_django import Job
from axa_django.conf import DEFAULTS
from axa_django.devdb import parse_url
from tests import docs_examples
from tests.conftest import Workers, database_url, wait_for
from tests.deploy_blocks import (
    COMPOSE,
    DOCKERFILE,
    ENV_FILE,
    KUBERNETES,
    LOGS,
    MIGRATE_QUEUE,
    PAGE,
    PRODUCTION,
    QUEUE_SETTINGS,
    ROUTERS,
    SECRET,
    VIEWS,
)
from tests.test_docs_samples import check_command, check_health_file_probe, migrate_argv, parse_yaml

ROOT = docs_examples.ROOT
# The newest Kubernetes the dev extra's kubernetes-validate>=1.30 is sure to ship schemas for.
KUBERNETES_VERSION = "1.30.0"
# The JSON formatter's fields, as the page promises them.
FIELDS = {"time", "level", "logger", "message"}


@contextlib.contextmanager
def page(*keys: str) -> Iterator[docs_examples.Page]:
    """docs/deployment.md open for the blocks ``keys``, which the test must all use."""
    every = frozenset(block.key for block in docs_examples.page_blocks(PAGE))
    with docs_examples.Page(PAGE, skip=every - set(keys)) as opened:
        yield opened


def environment_reads(code: str) -> tuple[set[str], set[str]]:
    """(variables the settings require, variables they read if set), from ``os.environ[...]`` / ``.get(...)``."""
    return set(re.findall(r'os\.environ\["(\w+)"\]', code)), set(re.findall(r'os\.environ\.get\("(\w+)"', code))


def production_settings(
    opened: docs_examples.Page, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], base: Path
) -> dict[str, Any]:
    """The page's production settings, run with exactly ``env`` for the variables they read."""
    required, optional = environment_reads(opened.blocks[PRODUCTION].code)
    for name in required | optional:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return opened.settings(PRODUCTION, BASE_DIR=base)


def json_lines(output: str) -> list[dict[str, Any]]:
    """Each line of a process's output as the JSON object it must be, with the promised fields."""
    records = [json.loads(line) for line in output.splitlines()]
    assert records and all(set(record) >= FIELDS for record in records), output
    return records


def runworker_options(argv: list[str]) -> Any:
    """``runworker``'s options as it parses them (exits 2 on one it does not take)."""
    parser = load_command_class(get_commands()["runworker"], "runworker").create_parser("manage.py", "runworker")
    return parser.parse_args(argv)


def shell_passes(command: str) -> bool:
    return subprocess.run(["sh", "-c", command], capture_output=True, timeout=10).returncode == 0


def start_manage(workers: Workers, command: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Run a page's ``python manage.py ...`` command from the repository's root with this Python."""
    assert command[:2] == ["python", "manage.py"], command
    proc = subprocess.Popen(
        [sys.executable, *command[1:]], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    workers.procs.append(proc)  # killed at teardown if the test fails first
    return proc


def deploy_env(workers: Workers, settings: str = "tests.deploy_settings", **extra: str) -> dict[str, str]:
    """A worker's environment: the test database as DATABASE_URL, the page's other variables, ``extra``."""
    env = workers.env(**{"DJANGO_SETTINGS_MODULE": settings, "DJANGO_SECRET_KEY": "tests", **extra})
    env.pop("DJANGO_DEBUG", None)
    return env


# -- production settings and JSON logs -----------------------------------------------------


def test_production_settings_read_the_environment(monkeypatch, tmp_path):
    with page(PRODUCTION, LOGS, ENV_FILE) as opened:
        url = "postgresql://shop:s%40cret@db1.internal:5432,db2.internal:5432/shop?target_session_attrs=read-write"
        env = {
            "DJANGO_SECRET_KEY": "k",
            "DATABASE_URL": url,
            "DJANGO_ALLOWED_HOSTS": "shop.example.com, www.shop.example.com",
        }
        ns = production_settings(opened, monkeypatch, env, tmp_path)
        assert (ns["SECRET_KEY"], ns["DEBUG"]) == ("k", False)
        assert ns["ALLOWED_HOSTS"] == ["shop.example.com", "www.shop.example.com"]
        assert ns["DATABASES"] == {"default": parse_url(url)}
        assert (ns["DATABASES"]["default"]["HOST"], ns["DATABASES"]["default"]["PASSWORD"]) == (
            "db1.internal,db2.internal",
            "s@cret",
        )
        assert ns["STATIC_ROOT"] == tmp_path / "staticfiles"
        assert production_settings(opened, monkeypatch, {**env, "DJANGO_DEBUG": "1"}, tmp_path)["DEBUG"] is True
        assert production_settings(opened, monkeypatch, {**env, "DJANGO_DEBUG": "0"}, tmp_path)["DEBUG"] is False
        assert (
            production_settings(opened, monkeypatch, {**env, "DJANGO_ALLOWED_HOSTS": ""}, tmp_path)["ALLOWED_HOSTS"]
            == []
        )
        for missing in ("DJANGO_SECRET_KEY", "DATABASE_URL"):
            with pytest.raises(KeyError, match=missing):  # as the page says: the process stops, naming it
                production_settings(opened, monkeypatch, {k: v for k, v in env.items() if k != missing}, tmp_path)

        # systemd's environment file gives every variable the settings require.
        lines = opened.block(ENV_FILE).code.splitlines()[1:]
        file_env = dict(line.split("=", 1) for line in lines)
        required, _ = environment_reads(opened.blocks[PRODUCTION].code)
        assert required <= set(file_env)
        assert production_settings(opened, monkeypatch, file_env, tmp_path)["ALLOWED_HOSTS"] == ["shop.example.com"]

        # LOGGING: the axa_django logger at INFO, everything through the page's JSON formatter.
        logs = opened.module(LOGS)
        config = ns["LOGGING"]
        assert config["disable_existing_loggers"] is False
        assert config["loggers"]["axa_django"]["level"] == "INFO"
        [handler] = config["root"]["handlers"]
        factory = import_string(config["formatters"][config["handlers"][handler]["formatter"]]["()"])
        assert factory is logs.JsonFormatter
        stream = io.StringIO()
        sink = logging.StreamHandler(stream)
        sink.setFormatter(factory())
        logger = logging.getLogger("axa_django")
        logger.addHandler(sink)
        saved = logger.level
        logger.setLevel(logging.INFO)
        try:
            logger.info("worker %s started:\nsecond line", "w1")
            try:
                raise RuntimeError("boom")
            except RuntimeError:
                logger.exception("job failed")
        finally:
            logger.removeHandler(sink)
            logger.setLevel(saved)
        started, failed = json_lines(stream.getvalue())
        assert set(started) == FIELDS and set(failed) == FIELDS | {"exception"}
        assert (started["level"], started["logger"], started["message"]) == (
            "INFO",
            "axa_django",
            "worker w1 started:\nsecond line",
        )
        assert started["time"].endswith("+00:00") and "RuntimeError: boom" in failed["exception"]


# -- Dockerfile ------------------------------------------------------------------------------

INSTRUCTIONS = {"FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "CMD", "ENTRYPOINT"}


def dockerfile(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) as docker reads them: comment lines dropped, backslash continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instruction, _, arguments = (pending + line).strip().partition(" ")
        assert instruction in INSTRUCTIONS, f"an instruction this test does not know: {instruction}"
        found.append((instruction, " ".join(arguments.split())))
        pending = ""
    assert not pending, "the last instruction continues past the end"
    return found


def exec_form(arguments: str) -> list[str]:
    """A CMD/ENTRYPOINT in exec form (a JSON list of strings): docker runs it without a shell."""
    command = json.loads(arguments)
    assert isinstance(command, list) and all(isinstance(word, str) for word in command), arguments
    return command


def image_facts(code: str) -> dict[str, Any]:
    """What the other examples rely on in the Dockerfile: its ENV, WORKDIR, user id, port and CMD."""
    steps = dockerfile(code)
    kinds = [kind for kind, _ in steps]
    assert "ENTRYPOINT" not in kinds and kinds.count("CMD") == 1 and kinds.count("USER") == 1
    env = dict(pair.split("=", 1) for kind, args in steps if kind == "ENV" for pair in shlex.split(args))
    [user] = [args for kind, args in steps if kind == "USER"]
    [port] = [args for kind, args in steps if kind == "EXPOSE"]
    [workdir] = [args for kind, args in steps if kind == "WORKDIR"]
    [cmd] = [exec_form(args) for kind, args in steps if kind == "CMD"]
    return {"steps": steps, "env": env, "user": user, "port": port, "workdir": workdir, "cmd": cmd}


def test_dockerfile(monkeypatch, tmp_path):
    with page(DOCKERFILE, PRODUCTION) as opened:
        facts = image_facts(opened.block(DOCKERFILE).code)
        steps = facts["steps"]
        assert steps[0][0] == "FROM"
        base = re.fullmatch(r"python:(\d+)\.(\d+)-slim", steps[0][1])
        assert base, steps[0]
        oldest = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"].removeprefix(">=")
        assert (int(base.group(1)), int(base.group(2))) >= tuple(int(part) for part in oldest.split("."))
        assert facts["env"]["PYTHONUNBUFFERED"] == "1"  # each log line reaches `docker logs` as it is written
        project = facts["env"]["DJANGO_SETTINGS_MODULE"].removesuffix(".settings")
        # compose's and Kubernetes' `python manage.py ...` run in WORKDIR: the project is copied there.
        assert facts["workdir"].startswith("/") and steps.index(("WORKDIR", facts["workdir"])) < steps.index(
            ("COPY", ". .")
        )

        runs = [(index, args) for index, (kind, args) in enumerate(steps) if kind == "RUN"]
        uid = None
        for _, line in runs:
            words = shlex.split(line)
            if words[0] == "useradd":
                uid = words[words.index("--uid") + 1]
                continue
            argv = check_command(line)  # pip's options and extras; manage.py's command and options
            if argv[1:2] == ["collectstatic"]:
                # The build has none of the runtime's variables: the line's placeholders are enough.
                build_env = {**facts["env"], **dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_]+=\S*", w))}
                ns = production_settings(opened, monkeypatch, build_env, tmp_path)
                assert ns["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"
                assert argv[2:] == ["--noinput"] and "STATIC_ROOT" in ns
        # An unprivileged user, by number (runAsNonRoot), after every RUN that needs root.
        assert uid is not None and facts["user"] == uid and int(uid) > 0
        assert steps.index(("USER", uid)) > max(index for index, _ in runs)

        # The web process: gunicorn on the exposed port, serving the project's WSGI module.
        cmd = facts["cmd"]
        assert cmd[0] == "gunicorn" and cmd[-1] == f"{project}.wsgi"
        assert cmd[cmd.index("--bind") + 1] == f"0.0.0.0:{facts['port']}"


# -- compose.yaml ------------------------------------------------------------------------------


def compose_shell(test: list[str]) -> str:
    """A CMD-SHELL healthcheck as the shell gets it: compose turns ``$$`` into ``$`` and would expand a lone ``$``."""
    kind, command = test
    assert kind == "CMD-SHELL"
    assert "$" not in command.replace("$$", ""), f"a $ compose would interpolate: {command}"
    return command.replace("$$", "$")


@pytest.mark.django_db(transaction=True)
def test_compose_worker_and_its_healthcheck(workers, tmp_path):
    with page(COMPOSE, DOCKERFILE) as opened:
        services = parse_yaml(opened.block(COMPOSE).code)["services"]
        image = image_facts(opened.block(DOCKERFILE).code)
        assert {s["image"] for s in services.values()} == {"shop"}
        assert {s["env_file"] for s in services.values()} == {"shop.env"}
        migrate_argv(shlex.split(services["migrate"]["command"]))
        assert services["migrate"]["restart"] == "no"
        for name in ("web", "worker"):
            assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
        assert "command" not in services["web"]  # the image's CMD
        assert [port.split(":")[-1] for port in services["web"]["ports"]] == [image["port"]]

        worker = services["worker"]
        command = shlex.split(worker["command"])
        options = runworker_options(command[3:])
        assert float(worker["stop_grace_period"].removesuffix("s")) > options.grace_period
        shell = compose_shell(worker["healthcheck"]["test"])
        assert options.health_file in shell
        # Healthy for at least two missed heartbeats (every LEASE_SECONDS / 3) at the default lease.
        limit = int(re.search(r"-lt (\d+)", shell).group(1))
        assert limit > 2 * DEFAULTS["LEASE_SECONDS"] / 3
        assert float(worker["healthcheck"]["interval"].removesuffix("s")) < limit

        # The worker as compose starts it (this machine's paths), under the page's production settings.
        health_file = tmp_path / "alive"
        check = shell.replace(options.health_file, str(health_file))
        proc = start_manage(
            workers, [w.replace(options.health_file, str(health_file)) for w in command], deploy_env(workers)
        )
        wait_for(lambda: shell_passes(check), 30, what="the healthcheck to pass on the worker's health file")
        stale = health_file.stat().st_mtime - 600
        os.utime(health_file, (stale, stale))
        wait_for(lambda: shell_passes(check), 30, what="the live worker to make its health file fresh again")

        proc.send_signal(signal.SIGTERM)  # docker stop
        assert proc.wait(timeout=60) == 0
        assert shell_passes(check)  # its last beat is recent
        os.utime(health_file, (stale, stale))  # as the file is once the limit has passed: no one touches it now
        assert not shell_passes(check)
        assert not shell_passes(check.replace(str(health_file), str(tmp_path / "never-written")))

        # Every line the worker wrote is one JSON object (the page's LOGGING): from its start to its stop.
        records = json_lines(proc.stdout.read())
        messages = [r["message"] for r in records if r["logger"] == "axa_django" and r["level"] == "INFO"]
        assert "database connections" in messages[0] and "stopped after" in messages[-1], messages


# -- Kubernetes --------------------------------------------------------------------------------


def container_env(container: dict[str, Any], secret: dict[str, Any]) -> dict[str, str]:
    """A container's environment, each variable from the Secret under the same name."""
    env = {}
    for variable in container["env"]:
        ref = variable["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] == variable["name"], variable
        env[variable["name"]] = secret["stringData"][ref["key"]]
    return env


@pytest.mark.django_db(transaction=True)
def test_kubernetes_manifests(workers, monkeypatch, tmp_path):
    with page(SECRET, KUBERNETES, DOCKERFILE, PRODUCTION) as opened:
        [secret] = yaml.safe_load_all(opened.block(SECRET).code)
        job, deployment = yaml.safe_load_all(opened.block(KUBERNETES).code)
        for manifest in (secret, job, deployment):
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        misspelt = json.loads(json.dumps(deployment).replace('"terminationGracePeriodSeconds"', '"terminationGrace"'))
        with pytest.raises(kubernetes_validate.ValidationError, match="terminationGrace"):
            kubernetes_validate.validate(misspelt, KUBERNETES_VERSION, strict=True)  # strict: it reads every key

        assert (secret["kind"], secret["type"]) == ("Secret", "Opaque")
        assert all("CHANGE-ME" in value for value in secret["stringData"].values())  # placeholders only
        assert (job["kind"], deployment["kind"]) == ("Job", "Deployment")
        job_pod, pod = job["spec"]["template"]["spec"], deployment["spec"]["template"]
        assert job_pod["restartPolicy"] == "Never"
        assert deployment["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"]
        [migrate] = job_pod["containers"]
        [wait] = pod["spec"]["initContainers"]
        [worker] = pod["spec"]["containers"]
        assert migrate_argv(migrate["command"]) == ["manage.py", "migrate", "--noinput"]
        assert migrate_argv(wait["command"]) == ["manage.py", "migrate", "--check"]
        assert migrate["image"] == wait["image"] == worker["image"]
        # runAsNonRoot needs the image's USER as a number, not 0.
        image = image_facts(opened.block(DOCKERFILE).code)
        for spec in (job_pod, pod["spec"]):
            assert spec["securityContext"]["runAsNonRoot"] is True
        assert int(image["user"]) > 0

        # Every container running manage.py has what the settings require, from the Secret.
        required, _ = environment_reads(opened.blocks[PRODUCTION].code)
        for container in (migrate, wait, worker):
            env = container_env(container, secret)
            assert required <= set(env), container["name"]
            production_settings(opened, monkeypatch, {**image["env"], **env}, tmp_path)

        options = runworker_options(worker["command"][3:])
        assert pod["spec"]["terminationGracePeriodSeconds"] > options.grace_period
        # The worker's command, with the Secret's key and this machine's database and path, then its probe.
        health_file = tmp_path / "alive"
        command = [w.replace(options.health_file, str(health_file)) for w in worker["command"]]
        secret_env = {k: v for k, v in container_env(worker, secret).items() if k != "DATABASE_URL"}
        proc = start_manage(workers, [*command, "--burst"], deploy_env(workers, **secret_env))
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
        json_lines(proc.stdout.read())
        check_health_file_probe(worker["readinessProbe"]["exec"]["command"], options.health_file, health_file)


# -- the queue on a database of its own --------------------------------------------------------


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def tables(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {name for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def welcome_statuses(url: str) -> list[str]:
    """The statuses of the send_welcome jobs in the queue database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT status FROM axa_queue WHERE name = 'shop.jobs.send_welcome'").fetchall()
    return sorted(status for (status,) in rows)


@contextlib.contextmanager
def new_databases(*names: str) -> Iterator[None]:
    """Empty databases ``names`` on the test server, dropped after (the test database keeps the suite's tables)."""
    server = with_database(database_url(), "postgres")
    with psycopg.connect(server, autocommit=True) as conn:
        for name in names:
            conn.execute(f"CREATE DATABASE {name}")
    try:
        yield
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.halved
def test_the_queue_on_a_database_of_its_own(workers, monkeypatch):
    with page(QUEUE_SETTINGS, ROUTERS, MIGRATE_QUEUE, VIEWS) as opened:
        routers = opened.module(ROUTERS)
        router = routers.QueueRouter()
        assert router.allow_migrate("queue", "axa_django") is True
        assert router.allow_migrate("default", "axa_django") is False
        assert router.allow_migrate("queue", "auth") is False
        assert router.allow_migrate("default", "auth") is None
        assert (router.db_for_read(Job), router.db_for_write(Job), router.db_for_read(User)) == ("queue", "queue", None)

        monkeypatch.setenv("QUEUE_DATABASE_URL", "postgresql://shop:secret@queue-db.internal:5432/shop_queue")
        base = {"default": parse_url("postgresql://shop:secret@db.internal:5432/shop")}
        ns = opened.settings(QUEUE_SETTINGS, os=os, parse_url=parse_url, DATABASES=dict(base))
        assert ns["DATABASES"] == {
            **base,
            "queue": parse_url("postgresql://shop:secret@queue-db.internal:5432/shop_queue"),
        }
        assert ns["AXA_DJANGO"] == {"DATABASE": routers.QUEUE}
        assert ns["DATABASE_ROUTERS"] == ["shop.routers.QueueRouter"]
        # migrate's own parser reads them in the scenario, where DATABASES has "queue".
        argvs = [shlex.split(line, comments=True) for line in opened.block(MIGRATE_QUEUE).code.splitlines()]
        assert argvs == [["python", "manage.py", "migrate", "--database", "queue"], ["python", "manage.py", "migrate"]]
        opened.block(VIEWS)  # run by tests/queue_db_scenario.py, where the queue database exists

    # Both databases new, as a project's are: the scenario migrates each as the page says.
    name = f"axa_deploy_{uuid.uuid4().hex[:10]}"
    with new_databases(name, f"{name}_queue"):
        default_url, queue_url = with_database(database_url(), name), with_database(database_url(), f"{name}_queue")
        env = deploy_env(workers, "tests.queue_db_settings", DATABASE_URL=default_url, QUEUE_DATABASE_URL=queue_url)
        scenario = subprocess.run(
            [sys.executable, "-m", "tests.queue_db_scenario", json.dumps([argv[2:] for argv in argvs])],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert scenario.returncode == 0, scenario.stdout + scenario.stderr
        seen = json.loads(scenario.stdout.splitlines()[-1])
        # migrate --check (the init container's) on each database: unapplied before the lines, applied after.
        assert seen["migrate_check"] == [[1, 1], [0, 0]]
        assert seen["router"] == ["shop.routers.QueueRouter"]  # the page's, as its settings name it
        assert (seen["job_database"], seen["user_database"]) == ("queue", "default")
        # Each database holds its own tables only.
        queue_tables, default_tables = tables(queue_url), tables(default_url)
        assert {table for table in queue_tables if not table.startswith("axa_")} == {"django_migrations"}
        assert "axa_queue" in queue_tables and "auth_user" in default_tables
        assert not any(table.startswith("axa_") for table in default_tables)
        # The consequence the page states: the job outlives the transaction that rolled back.
        assert seen["orphan_saved"] is True and "never-saved" not in seen["users"]
        # The page's on_commit: nothing when default rolls back, the job once it commits.
        assert seen["enqueued_after_rollback"] == 1 and seen["users"] == ["ann"]
        assert len(seen["welcome_args"]) == 2 and seen["ann"] in seen["welcome_args"]
        # A reference to a job still reads it; a join across the databases fails as the page says.
        assert seen["report_job"] and seen["joined"].startswith('relation "axa_queue" does not exist'), seen["joined"]
        # jobhealth reads the queue database: two ready jobs, no worker.
        assert any("2 ready job(s)" in reason for reason in seen["health"]["reasons"]), seen["health"]
        assert welcome_statuses(queue_url) == ["queued", "queued"]

        proc = workers.start("--burst", "-v", "2", env=env)
        assert proc.wait(timeout=60) == 0
        attempts = [r for r in json_lines(proc.stdout.read()) if r["logger"] == "axa_django.jobs"]
        assert len(attempts) == 2 and all("completed" in r["message"] for r in attempts), attempts
        assert welcome_statuses(queue_url) == ["completed", "completed"]
