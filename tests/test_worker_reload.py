"""runworker --reload restarts the worker when its code changes, its running jobs finished or given back (issue 45).

A worker started before a job's code changed ran the old code until restarted by hand.
With --reload, Django's autoreloader watches the files; the worker stops as on SIGTERM
(its jobs finish within the grace period, the rest go back to the queue) and starts
again with the new code.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from axa_django import Job
from axa_django.models import Worker as WorkerRow
from axa_django.worker import Worker
from axa_django.worker.pools import Pools
from tests.conftest import AXA_APPS, wait_for

pytestmark = pytest.mark.django_db(transaction=True, available_apps=AXA_APPS)

SETTINGS = """
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "reloadapp"]  # noqa: F405
"""
# The first version runs until the worker gives it up; the second returns at once.
V1 = """
import time
from pathlib import Path

from axa_django import background_job


@background_job(name="reload.work")
def work(marker: str) -> str:
    Path(marker).touch()
    time.sleep(60)
    return "v1"
"""
V2 = """
from axa_django import background_job


@background_job(name="reload.work")
def work(marker: str) -> str:
    return "v2, a version of another length"
"""


@pytest.mark.halved
def test_a_changed_job_module_restarts_the_worker_which_runs_the_new_code(workers, tmp_path):
    app = tmp_path / "reloadapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    module = app / "jobs.py"
    module.write_text(V1)
    (tmp_path / "reload_settings.py").write_text(SETTINGS)
    env = workers.env(
        DJANGO_SETTINGS_MODULE="reload_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        PYTHONDONTWRITEBYTECODE="1",
        AXA_LOG_LEVEL="INFO",
    )
    proc = workers.start("--reload", "--concurrency", "1", "--grace-period", "0.5", env=env)
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    marker = tmp_path / "started"
    with connection.cursor() as cursor:  # by name: the job's module is not this process's
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args) VALUES (gen_random_uuid(), 'reload.work', %s) RETURNING id",
            [f'{{"marker": "{marker}"}}'],
        )
        job_id = cursor.fetchone()[0]
    wait_for(marker.exists, timeout=30, what="the first version to start")
    wait_for(lambda: any("watching for code changes" in line for line in output), what="the reloader")
    module.write_text(V2)

    def restarted() -> bool:
        # The reloader's first look at the files may come after the write: touch until it sees a change.
        os.utime(module, (time.time(), time.time()))
        return any("jobs.py changed: restarting the worker" in line for line in output)

    wait_for(restarted, what="the reload")
    job = wait_for(lambda: Job.objects.filter(pk=job_id, status="completed").first(), what="the new code's run")
    assert job.result == "v2, a version of another length"
    assert [entry["type"] for entry in job.errors] == ["Interrupted"], job.errors  # given back after the grace
    assert sum("starting: concurrency 1" in line for line in output) == 2, "".join(output)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, "".join(output)
    wait_for(lambda: not WorkerRow.objects.exists(), timeout=10, what="the worker to unregister")
    assert any("received SIGTERM: finishing jobs in progress" in line for line in output), "".join(output)


def test_reload_is_refused_with_burst():
    with pytest.raises(CommandError, match="--reload restarts a worker that runs until stopped, and --burst") as error:
        call_command("runworker", "--reload", "--burst")
    assert error.value.returncode == 2


def test_a_pool_that_stops_with_an_error_stops_the_others(settings):
    # It read an attribute workers do not have: the pool's thread died, and the others ran on.
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "NOTIFY": False}  # no 2 s probe of a listener stopped at once
    pools = Pools({"emails": 1, "default": 1}, install_signals=False)
    failing: Worker = pools.workers[0]
    failing.run = lambda: 1  # type: ignore[method-assign]
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(pools.run()))
    thread.start()
    thread.join(timeout=30)
    assert result == [1] and not thread.is_alive()
    assert pools.workers[1].control.stopping.is_set()
