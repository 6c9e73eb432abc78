"""A bulk retry in a real headless Chromium: from the failed list's filter to the progress page saying done."""

from __future__ import annotations

from typing import Any

from axa_django.models.queue import BulkOperation
from tests import test_browser
from tests.conftest import ON_A_GIVEN_SERVER, Workers
from tests.test_browser import screenshot
from tests.test_bulk_worker import QUIET, failed_rows, runs

pytestmark = [ON_A_GIVEN_SERVER, *test_browser.pytestmark]
page = test_browser.page  # the logged-in admin tab


def test_a_bulk_retry_started_from_the_list_runs_to_done_on_its_progress_page(
    page: Any, live_server: Any, workers: Workers
) -> None:
    failed_rows(300)
    workers.start("--concurrency", "2", env=workers.env(**QUIET))
    page.goto(f"{live_server.url}/admin/axa_django/failedjob/?name=CountWorker")
    page.click("#axa-retry-matching")
    page.wait_for_selector("#axa-bulk-count")
    assert "Retry 300 failed jobs" in page.locator("#axa-bulk-count").inner_text()
    assert "name = CountWorker" in page.locator("#axa-bulk-filters").inner_text()
    page.fill("#id_batch_size", "40")
    page.fill("#id_pause_ms", "100")
    page.click("#axa-bulk-confirm")
    page.wait_for_selector("#axa-bulk-status")
    op = BulkOperation.objects.get()
    assert page.url.endswith(f"/admin/axa_django/bulkoperation/{op.pk}/change/")
    # The poll brings the figures in, then reloads the page once the operation is over.
    page.wait_for_selector("#axa-live[data-state=over]", timeout=60_000)
    op.refresh_from_db()
    assert op.status == "done" and (op.matched, op.changed, op.skipped) == (300, 300, 0)
    assert page.locator("#axa-bulk-status").inner_text().strip() == "Done"
    assert page.locator("#axa-bulk-changed").inner_text() == "300"
    assert page.locator("#axa-bulk-skipped").inner_text() == "0"
    assert 300 - runs().get((1, "failed"), 0) == 300  # none of them is failed with its first error alone
    test_browser.breadcrumbs_styled(page)
    screenshot(page, "bulk-progress.png", docs=True)
    page.click("text=Bulk operations")
    assert f"#{op.pk} retry" in page.locator("#result_list").inner_text()
