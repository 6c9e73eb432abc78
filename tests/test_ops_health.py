"""jobhealth (exit code, one line per reason, --json) and runworker --health-file (issue 15, part 1)."""

import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from axa_django import Job
from tests.conftest import AXA_APPS, ROOT, wait_for
from tests.testapp import ops_jobs

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)


def jobhealth(*args: str) -> tuple[int, str]:
    """Run jobhealth in this process (its database is the test database); return (exit code, output)."""
    out = StringIO()
    try:
        call_command("jobhealth", *args, stdout=out)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


def insert(name: str, queue: str, run_at: str = "now() - interval '1 hour'", status: str = "queued") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, run_at, status) "
            f"VALUES (gen_random_uuid(), %s, '{{}}', %s, {run_at}, %s)",
            [name, queue, status],
        )


def fake_worker(age: float, queues: str = "[]", names: str = '["ops.noop"]') -> None:
    """A worker row whose heartbeat is ``age`` seconds old (no process behind it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_worker (id, hostname, pid, concurrency, queues, names, heartbeat_at) "
            "VALUES (gen_random_uuid(), 'host-x', 4242, 2, %s::jsonb, %s::jsonb, now() - make_interval(secs => %s))",
            [queues, names, age],
        )


def test_healthy_with_a_live_worker_and_its_health_file(workers, tmp_path):
    beat = tmp_path / "alive"
    workers.start("--concurrency", "1", "--health-file", str(beat))
    wait_for(beat.exists, what="the health file")
    first = beat.stat().st_mtime_ns
    job = ops_jobs.nap.perform_later(0)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", what="the job to run")
    code, out = jobhealth("--require-workers", "1", "--max-ready-age", "60")
    assert (code, out.splitlines()[0].split(",")[0]) == (0, "healthy: 1 live worker(s)"), out
    # Each heartbeat (every lease/3) touches the file again.
    wait_for(lambda: beat.stat().st_mtime_ns > first, what="the heartbeat to touch the file")
    code, out = jobhealth("--require-workers", "2")
    assert code == 1 and out == "unhealthy: 1 live worker(s), fewer than --require-workers 2\n"


def test_each_reason_on_its_own_line_and_exit_1():
    insert("ops.noop", "mail")
    insert("ops.noop", "mail", run_at="now() + interval '1 hour'")  # scheduled: not ready
    code, out = jobhealth("--max-ready-age", "60")
    assert code == 1
    assert out.splitlines() == [
        "unhealthy: queue 'mail': 1 ready job(s) and no live worker claims from this queue",
        "unhealthy: queue 'mail': the oldest ready job has waited "
        + out.split("has waited ")[1].split("s,")[0]
        + "s, longer than --max-ready-age 60s (1 ready)",
    ]
    assert float(out.split("has waited ")[1].split("s,")[0].replace(",", "")) >= 3600


def test_a_late_heartbeat_and_an_unhandled_name():
    fake_worker(age=2.5)  # tests lease 3s: beats every 1s, late after 2s, dead after 3s
    insert("ops.unknown", "default")
    code, out = jobhealth()
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert lines[0].startswith("unhealthy: worker ") and "on host 'host-x' (pid 4242): last heartbeat" in lines[0]
    assert "late (it beats every 1s; presumed dead after 3s)" in lines[0]
    assert lines[1] == "unhealthy: job 'ops.unknown' in queue 'default': 1 ready and no live worker claims them"


def test_queue_option_judges_only_those_queues():
    insert("ops.noop", "mail")
    insert("ops.noop", "reports")
    code, out = jobhealth("--queue", "reports", "--queue", "reports")
    assert code == 1 and out == "unhealthy: queue 'reports': 1 ready job(s) and no live worker claims from this queue\n"
    code, out = jobhealth("--queue", "elsewhere")
    assert (code, out) == (0, "healthy: 0 live worker(s), 0 ready job(s), oldest ready 0.0s\n")


def test_hostile_names_cannot_forge_a_line():
    # Rows written by SQL with names no enqueue would accept.
    insert("x\nunhealthy: forged {0} %s", "q\r\nhealthy: yes")
    code, out = jobhealth()
    assert (code, out) == (
        1,
        "unhealthy: queue 'q\\r\\nhealthy: yes': 1 ready job(s) and no live worker claims from this queue\n",
    )
    fake_worker(age=0, names="[]")  # covers every queue, claims no name
    code, out = jobhealth()
    assert (code, out) == (
        1,
        "unhealthy: job 'x\\nunhealthy: forged {0} %s' in queue 'q\\r\\nhealthy: yes': 1 ready and no live worker claims them\n",
    )


def test_json_gives_the_verdict_and_the_figures():
    insert("ops.noop", "mail")
    insert("ops.noop", "mail", status="failed")
    fake_worker(age=0, queues='["mail"]')
    code, out = jobhealth("--json")
    data = json.loads(out)
    assert code == 0 and data["healthy"] is True and data["reasons"] == []
    figures = data["figures"]
    (mail,) = [q for q in figures["queues"] if q["queue"] == "mail"]
    assert (mail["ready"], mail["running"], mail["ready_capped"]) == (1, 0, False)
    assert mail["oldest_ready_seconds"] >= 3600
    assert figures["statuses"] == {"queued": 1, "failed": 1} and figures["statuses_estimated"] is False
    assert (figures["live_workers"], figures["threads"], figures["threads_busy"]) == (1, 2, 0)
    assert json.loads(jobhealth("--json", "--require-workers", "3")[1])["reasons"] == [
        "1 live worker(s), fewer than --require-workers 3"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-ready-age", "-5"], "must be a positive number of seconds, got -5"),
        (["--max-ready-age", "soon"], "expected a number of seconds, got 'soon'"),
        (["--max-ready-age", "inf"], "must be a positive number of seconds, got inf"),
        (["--require-workers", "0"], "must be at least 1, got 0"),
        (["--require-workers", "2.5"], "expected a whole number of workers, got '2.5'"),
        (["--queue", " "], "a queue name cannot be empty or blank"),
        (["--queue", "a\x00b"], "a queue name cannot contain control characters"),
    ],
)
def test_bad_options_are_refused_before_any_sql(args, message, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(CommandError, match="argument") as raised:
        call_command("jobhealth", *args)
    assert message in str(raised.value)


def test_an_unreachable_database_is_unhealthy_not_a_traceback():
    with socket_free_port() as port:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONUNBUFFERED="1")
        env["DATABASE_URL"] = f"postgresql://nobody:x@127.0.0.1:{port}/nothing"
        proc = subprocess.run(
            [sys.executable, "-m", "django", "jobhealth"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("unhealthy: cannot read the queue database: ") and proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr


def test_runworker_refuses_a_health_file_it_cannot_write(workers, tmp_path):
    for path, message in [
        (str(tmp_path / "missing" / "alive"), "does not exist; create it first"),
        (str(tmp_path), "is a directory; give a file path inside it"),
    ]:
        proc = workers.start("--health-file", path)
        assert proc.wait(timeout=60) == 2
        assert message in proc.stdout.read()


class socket_free_port:
    """A TCP port on 127.0.0.1 nothing listens on."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        return None


def test_odd_rows_and_sql_looking_names_are_data():
    insert("ops.noop", "a'); DROP TABLE axa_queue; --", run_at="'-infinity'")
    insert("ops.noop", "later", run_at="'infinity'")
    code, out = jobhealth("--max-ready-age", "60", "--queue", "a'); DROP TABLE axa_queue; --", "--json")
    data = json.loads(out)
    (queue,) = data["figures"]["queues"]
    assert code == 1 and queue["ready"] == 1 and queue["oldest_ready_seconds"] > 99 * 365 * 86400
    assert len(data["reasons"]) == 2 and Job.objects.count() == 2
    code, out = jobhealth("--json")
    later = [q for q in json.loads(out)["figures"]["queues"] if q["queue"] == "later"]
    assert later[0]["scheduled"] == 1 and later[0]["oldest_ready_seconds"] is None
