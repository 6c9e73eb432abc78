"""End to end in a real headless Chromium: log in, retry a failed job, let a worker run it, see it completed."""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from axa_django.models import Job, Worker
from tests.conftest import ROOT, Workers, wait_for
from tests.testapp import jobs

CHROMIUM = os.environ.get("AXA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
DOCS = ROOT / "docs"

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
pytestmark = [
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def page(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A logged-in admin page in headless Chromium."""
    # Playwright's sync API keeps an event loop running in this thread, so Django takes
    # the test's plain synchronous ORM calls for async code; they are safe here.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1366, "height": 768})
            tab = context.new_page()
            tab.set_default_timeout(30_000)
            tab.goto(f"{live_server.url}/admin/login/")
            tab.fill("#id_username", "admin")
            tab.fill("#id_password", "correct horse")
            tab.click("input[type=submit]")
            tab.wait_for_url(f"{live_server.url}/admin/")
            yield tab
        finally:
            browser.close()
            # ORM calls made while Playwright's loop runs get their own connection
            # (Django's connections are context-local); close it, or it outlives the test database.
            connections.close_all()


def screenshot(tab: Any, name: str, *, docs: bool = False, full_page: bool = True) -> Path:
    """Save a full-page screenshot where CI keeps it; AXA_UPDATE_DOCS=1 also refreshes the README's copy."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / name
    tab.screenshot(path=str(target), full_page=full_page)
    assert target.stat().st_size > 10_000
    if docs and os.environ.get("AXA_UPDATE_DOCS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(target, DOCS / name)
    return target


def backfill_a_day() -> int:
    """Rows as a day of work leaves them, so the dashboard's chart has a shape to draw."""
    now = timezone.now()
    rows = []
    for hour in range(1, 24):
        finished = now - datetime.timedelta(hours=hour)  # inside the chart's 24-hour window
        done = 20 + (hour * 37) % 60
        for i in range(done + hour % 4):
            rows.append(
                Job(
                    name="tests.testapp.jobs.add",
                    args={"a": i, "b": hour},
                    status="failed" if i >= done else "completed",
                    attempts=1,
                    started_at=finished - datetime.timedelta(milliseconds=40),
                    finished_at=finished,
                    error="ValueError: backfilled" if i >= done else None,
                )
            )
    Job.objects.bulk_create(rows)
    return len(rows)


def drain(workers: Workers) -> None:
    """Run a real worker process until the queue holds nothing it can run."""
    proc = workers.start("--burst")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out


def error_cells_fit(tab: Any) -> None:
    """Every Error cell ends inside the 1366 px viewport: the column is not pushed off screen."""
    width = tab.viewport_size["width"]
    cells = tab.locator("#result_list td.field-error_shown")
    assert cells.count() > 0
    for i in range(cells.count()):
        box = cells.nth(i).bounding_box()
        assert box is not None and box["x"] + box["width"] <= width, (box, width)
    assert tab.evaluate("document.documentElement.scrollWidth") <= width


def breadcrumbs_styled(tab: Any) -> None:
    """The breadcrumbs carry the admin's bar (Django 5.2 styles <div>, 6 <ol>) and sit above the sidebar."""
    crumbs = tab.locator(".breadcrumbs")
    assert crumbs.count() == 1
    background = crumbs.evaluate("e => getComputedStyle(e).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), background
    box = crumbs.bounding_box()
    assert box is not None and box["x"] <= 1 and box["height"] > 20, box
    sidebar = tab.locator("#nav-sidebar")
    if sidebar.count() and sidebar.is_visible():
        assert box["y"] + box["height"] <= sidebar.bounding_box()["y"] + 1


def test_retry_a_failed_job_in_the_browser_and_a_worker_completes_it(
    page: Any, live_server: Any, workers: Workers, tmp_path: Path
) -> None:
    # A job that fails on its only attempt and would succeed on the next run.
    log = tmp_path / "flaky.log"
    log.write_text("earlier run\n")
    job = jobs.flaky.using(max_attempts=1).perform_later(log=str(log))
    for n in range(3):
        jobs.add.perform_later(n, b=1)
    jobs.count.perform_later(fail=True)
    jobs.record.perform_later(token="<script>alert('x')</script>", log=str(tmp_path / "r.log"))
    drain(workers)
    # A long error, as a Rust producer's FINISH leaves it: the list must still fit 1366 px.
    long_error = "RuntimeError: " + " ".join(f"upstream-service-{n}-refused" for n in range(40))
    Job.objects.create(
        name="CountWorker",
        args={"fail": True},
        status="failed",
        attempts=1,
        error=long_error,
        finished_at=timezone.now(),
    )
    job.refresh_from_db()
    assert job.status == "failed" and "flaky run 2" in job.error

    # The index links the failed jobs page; it lists the failure with its error line.
    page.click("text=Failed jobs")
    page.wait_for_selector("#result_list")
    row = page.locator("#result_list tbody tr", has_text="flaky")
    assert "ValueError: flaky run 2" in row.inner_text()
    assert page.locator("#result_list tbody tr").count() == 3  # flaky, CountWorker and the long error
    error_cells_fit(page)
    screenshot(page, "failed-jobs.png", docs=True)

    # Open it, retry it, and see it queued.
    row.locator("th a").first.click()
    page.wait_for_selector("#axa-retry")
    assert "flaky run 2" in page.locator("#axa-attempts").inner_text()
    # The failure comes before the result fields; booleans read as words.
    failure_top = page.locator("#axa-attempts").bounding_box()["y"]
    assert failure_top < page.locator(".field-result_shown").bounding_box()["y"]
    assert page.locator(".field-cancel_requested_shown .readonly").inner_text().strip() == "no"
    screenshot(page, "failed-job-detail.png")
    page.click("#axa-retry")
    page.wait_for_selector(".messagelist .success")
    assert "queued to run again" in page.locator(".messagelist").inner_text()
    assert page.locator(".field-status_marker .axa-badge").inner_text().strip().endswith("Queued")
    assert page.locator("#axa-retry").count() == 0
    job.refresh_from_db()
    assert job.status == "queued" and job.attempts == 0

    # A worker runs it; a reload shows it completed with its result.
    drain(workers)
    page.reload()
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "completed", 10, "the retried job to complete")
    assert page.locator(".field-status_marker .axa-badge").inner_text().strip().endswith("Completed")
    assert "3" in page.locator(".field-result_shown pre").inner_text()
    # Its earlier failure stays in the history.
    assert "flaky run 2" in page.locator("#axa-attempts").inner_text()
    screenshot(page, "job-detail.png")

    # The job list escapes what a row holds.
    page.goto(f"{live_server.url}/admin/axa_django/job/?q=script")
    page.click("#result_list tbody tr th a")
    assert "<script>alert('x')</script>" in page.locator(".field-args_shown pre").inner_text()

    # The dashboard, with a day of history and a live worker heartbeating.
    backfilled = backfill_a_day()
    page.goto(f"{live_server.url}/admin/axa_django/job/")
    assert page.locator("#result_list tbody tr").count() == 50
    assert f"{Job.objects.count():,} jobs" in page.locator(".paginator").inner_text()
    error_cells_fit(page)
    screenshot(page, "jobs.png", full_page=False)
    live = workers.start()
    wait_for(lambda: Worker.objects.exists(), 30, "the worker to register")
    page.goto(f"{live_server.url}/admin/")
    page.click("text=Dashboard")
    page.wait_for_selector("#axa-chart svg")
    assert page.locator("#axa-workers tbody tr").count() == 1
    counts = page.locator("#axa-counts").inner_text()
    assert "Completed" in counts and "Failed" in counts
    assert page.locator("#axa-chart svg rect.axa-bar-ok").count() == 24
    legend = page.locator(".axa-legend").inner_text()
    assert f"completed: {Job.objects.filter(status='completed').count():,}" in legend
    assert backfilled > 24 * 20
    breadcrumbs_styled(page)
    screenshot(page, "dashboard.png", docs=True)
    live.terminate()
    live.wait(timeout=30)
    assert live.returncode == 0


def test_the_dashboard_refreshes_itself_and_pauses_while_hidden(page: Any, live_server: Any) -> None:
    from tests.testapp import ops_jobs

    page.goto(f"{live_server.url}/admin/axa_django/queuedashboard/?refresh=1")  # every second, for the test
    assert "No queue holds jobs." in page.locator("#axa-queues").inner_text()
    ops_jobs.nap.using(queue="live-q").perform_later(0)
    # No reload: the poll brings the new queue in.
    page.wait_for_function("document.querySelector('#axa-queues tbody').textContent.includes('live-q')")
    assert page.locator("#axa-live").get_attribute("data-state") == "live"
    assert "Updated " in page.locator("#axa-live-state").inner_text()
    # Hide the tab: the poll stops until it is visible again.
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    assert page.locator("#axa-live").get_attribute("data-state") == "paused"
    before = page.locator("#axa-live").get_attribute("data-refreshes")
    ops_jobs.nap.using(queue="while-hidden").perform_later(0)
    # Let more than one interval pass on the browser's clock.
    page.wait_for_function("(t0) => performance.now() - t0 > 2500", arg=page.evaluate("performance.now()"))
    assert page.locator("#axa-live").get_attribute("data-refreshes") == before
    assert "while-hidden" not in page.locator("#axa-queues").inner_text()
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    page.wait_for_function("document.querySelector('#axa-queues tbody').textContent.includes('while-hidden')")
    assert page.locator("#axa-live").get_attribute("data-state") == "live"
