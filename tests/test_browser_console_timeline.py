"""In headless Chromium: a retried workflow job's timeline and graph, Run now, and disabling a periodic job."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry

from axa_django import Job, workflow
from axa_django.models import Schedule, Worker
from axa_django.registry import JobFunction
from tests.conftest import ON_A_GIVEN_SERVER, Workers, wait_for
from tests.test_browser import CHROMIUM, page, screenshot  # noqa: F401  (page: the logged-in tab fixture)
from tests.test_console_periodic import periodic  # noqa: F401  (periodic jobs registered for one test)
from tests.testapp import jobs
from tests.testapp import workflow_jobs as wj

pytestmark = [
    ON_A_GIVEN_SERVER,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.django_db(transaction=True),
]


def test_a_retried_workflow_job_shows_its_attempts_and_links_its_child_and_run_now_runs_a_scheduled_job(
    page: Any,  # noqa: F811
    live_server: Any,
    workers: Workers,
    tmp_path: Path,
) -> None:
    log = tmp_path / "flaky.log"
    log.write_text("earlier run\n")  # flaky fails its next run (the 2nd) and completes the one after
    with workflow("nightly") as wf:
        parent = wf.add(jobs.flaky, log=str(log))
        child = wf.add(wj.noop, 1, after=[parent])
    later = wj.noop.using(delay=datetime.timedelta(hours=1)).perform_later(2)
    live = workers.start("--concurrency", "2")
    wait_for(lambda: Job.objects.get(pk=child.pk).status == "completed", 60, "the workflow to complete")
    host, pid = Worker.objects.values_list("hostname", "pid").get()

    page.goto(f"{live_server.url}/admin/axa_django/job/{parent.pk}/change/")
    timeline = page.locator("#axa-timeline")
    events = timeline.locator("td.axa-what").all_inner_texts()
    # The first attempt left only its end; the second its readiness (the retry), start and finish.
    assert events == ["Enqueued", "Attempt 1 ended", "Ready again", "Started attempt 2", "Completed"]
    attempt = timeline.locator("tr", has_text="Attempt 1 ended").inner_text()
    assert "ValueError: flaky run 2" in attempt and f"{host} pid {pid}" in attempt
    assert Job.objects.get(pk=parent.pk).attempts == 2
    # The graph: the child, completed, one click away.
    node = page.locator(f'#axa-graph [data-job="{child.pk}"]')
    assert "Completed" in node.text_content()
    screenshot(page, "job-timeline.png", docs=True)
    node.click()
    page.wait_for_url(f"**/admin/axa_django/job/{child.pk}/change/")
    assert page.locator("#axa-timeline td.axa-what").all_inner_texts()[:2] == ["Enqueued", "Parents done"]
    assert page.locator(f'#axa-graph [data-job="{parent.pk}"]').count() == 1

    # Run now: the scheduled job runs at once on the live worker.
    page.goto(f"{live_server.url}/admin/axa_django/job/{later.pk}/change/")
    assert "Scheduled to run" in page.locator("#axa-timeline").inner_text()
    page.click("#axa-run-now")
    page.wait_for_selector(".messagelist .success")
    assert "runs now" in page.locator(".messagelist").inner_text()
    wait_for(lambda: Job.objects.get(pk=later.pk).status == "completed", 30, "the job run now to complete")
    page.reload()
    assert page.locator("#axa-timeline td.axa-what").all_inner_texts()[-1] == "Completed"
    assert LogEntry.objects.get(object_id=str(later.pk)).get_change_message().startswith("Run now")
    live.terminate()
    live.wait(timeout=30)
    assert live.returncode == 0


def test_disable_a_periodic_job_from_its_page(
    page: Any,  # noqa: F811
    live_server: Any,
    periodic: dict[str, JobFunction[Any, Any]],  # noqa: F811
) -> None:
    five = periodic["five"]
    page.goto(f"{live_server.url}/admin/")
    page.click("text=Periodic jobs")
    row = page.locator(f'#axa-periodic tr[data-name="{five.name}"]')
    assert row.locator("td.axa-words").inner_text() == "every 5 minutes"
    assert row.locator("td.axa-enabled").inner_text() == "yes"
    row.locator("button", has_text="Disable").click()
    page.wait_for_selector(".messagelist .success")
    assert f"Periodic job {five.name} disabled" in page.locator(".messagelist").inner_text()
    row = page.locator(f'#axa-periodic tr[data-name="{five.name}"]')
    assert row.locator("td.axa-enabled").inner_text() == "no"
    assert row.locator("td.axa-next").inner_text() == "- (disabled)"
    assert row.locator("button", has_text="Enable").count() == 1
    assert not Schedule.objects.get(name=five.name).enabled
    assert LogEntry.objects.filter(object_id=five.name).count() == 1
    screenshot(page, "periodic-jobs.png", docs=True)
