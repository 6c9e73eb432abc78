"""The Queues and Workers pages in a real headless Chromium: pause a queue from the page, stop a worker from the page."""

from __future__ import annotations

import os
from typing import Any

import pytest

from axa_django.models import QueuePause, Worker
from tests.conftest import ON_A_GIVEN_SERVER, Workers, wait_for
from tests.test_browser import CHROMIUM, breadcrumbs_styled, page, screenshot
from tests.testapp import ops_jobs

__all__ = ["page"]  # the fixture, shared with tests/test_browser.py

pytestmark = [
    ON_A_GIVEN_SERVER,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    ),
    pytest.mark.django_db(transaction=True),
]


def test_pause_a_queue_from_the_queues_page_and_see_it_paused(page: Any, live_server: Any) -> None:
    ops_jobs.nap.using(queue="mail").perform_later(0)
    page.goto(f"{live_server.url}/admin/")
    page.click("#content-main a[href$='/axa_django/queue/']")
    row = page.locator('#axa-queue-table tr[data-queue="mail"]')
    assert row.locator(".axa-q-ready").inner_text() == "1"
    breadcrumbs_styled(page)

    # The row's Pause fills the form below; the pause comes back as the page's state.
    row.locator("a[data-do=pause]").click()
    assert page.locator("#axa-pause-form [name=queue]").input_value() == "mail"
    page.fill("#axa-pause-form [name=reason]", "provider <down>")
    page.click("#axa-pause-form button[type=submit]")
    page.wait_for_selector(".messagelist .success")
    assert "Queue 'mail' paused" in page.locator(".messagelist").inner_text()
    state = page.locator('#axa-queue-table tr[data-queue="mail"] .axa-q-state').inner_text()
    assert state.startswith("paused by admin") and state.endswith(": provider <down>")
    assert QueuePause.objects.get(queue="mail").reason == "provider <down>"

    # Live: a new job shows without a reload; hidden, the page stops asking.
    page.goto(f"{live_server.url}/admin/axa_django/queue/?refresh=1")
    ops_jobs.nap.using(queue="mail").perform_later(0)
    page.wait_for_function(
        "document.querySelector('#axa-queue-table tr[data-queue=\"mail\"] .axa-q-ready').textContent === '2'"
    )
    assert page.locator('#axa-queue-table tr[data-queue="mail"] button').inner_text() == "Resume"
    screenshot(page, "queues.png", docs=True)
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    assert page.locator("#axa-live").get_attribute("data-state") == "paused"

    # Resume from the row the poll rebuilt. Shown again, the page refreshes at once: clicked while
    # that refresh replaced the row, the click reached a row no longer in the page (CI, once).
    refreshes = int(page.locator("#axa-live").get_attribute("data-refreshes") or 0)
    page.evaluate(
        "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'))"
    )
    page.wait_for_function(f"Number(document.getElementById('axa-live').dataset.refreshes) > {refreshes}")
    page.locator('#axa-queue-table tr[data-queue="mail"] button', has_text="Resume").click()
    page.wait_for_selector(".messagelist .success")
    assert "Queue 'mail' resumed" in page.locator(".messagelist").inner_text()
    assert not QueuePause.objects.exists()


def test_stop_a_worker_from_the_workers_page_and_see_it_gone(page: Any, live_server: Any, workers: Workers) -> None:
    proc = workers.start("--concurrency", "2")
    row = wait_for(lambda: Worker.objects.first(), what="the worker to register")
    page.goto(f"{live_server.url}/admin/axa_django/liveworker/?refresh=1")
    assert page.locator(f'#axa-worker-table tr[data-worker="{row.pk}"] .axa-w-busy').inner_text() == "0 of 2"
    # The poll brings the job in as it starts, linked to its page.
    job = ops_jobs.nap.perform_later(2.0)
    link = page.locator(f'#axa-worker-table li[data-job="{job.pk}"] a')
    link.wait_for()
    assert link.inner_text() == "ops.sleep" and link.get_attribute("href").endswith(f"/job/{job.pk}/change/")
    screenshot(page, "workers.png", docs=True)

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(f'#axa-worker-table tr[data-worker="{row.pk}"] button', has_text="Stop").click()
    page.wait_for_selector(".messagelist .success")
    assert "was asked to stop" in page.locator(".messagelist").inner_text()
    # Gone from the page without a reload once it has finished its job and exited.
    page.wait_for_function(
        "document.querySelector('#axa-worker-table tbody').textContent.includes('No worker is running.')"
    )
    assert proc.wait(timeout=30) == 0
    job.refresh_from_db()
    assert job.status == "completed" and not Worker.objects.exists()
