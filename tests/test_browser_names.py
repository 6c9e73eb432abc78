"""The Job names page in a real headless Chromium: open it from the index, sort by a column, open a name's chart."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.db import connection

from tests import test_browser
from tests.conftest import ON_A_GIVEN_SERVER
from tests.test_browser import CHROMIUM, breadcrumbs_styled, screenshot

page = test_browser.page  # the logged-in tab, a fixture

pytestmark = [
    ON_A_GIVEN_SERVER,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.django_db(transaction=True),
]


def test_sort_the_job_names_and_open_a_names_chart(page: Any, live_server: Any) -> None:
    # Three names over the day: a fast busy one, a slow one, one that fails.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_history (id, name, args, status, started_at, finished_at, attempts) "
            "SELECT gen_random_uuid(), n.name, '{}', CASE WHEN n.name = 'shop.jobs.charge' AND i % 4 = 0 "
            "THEN 'failed' ELSE 'completed' END, f - make_interval(secs => n.seconds * (1 + i % 5)), f, 1 "
            "FROM (VALUES ('shop.jobs.send_welcome', 0.02, 300), ('shop.jobs.export', 40.0, 20), "
            "('shop.jobs.charge', 0.4, 120)) AS n(name, seconds, rows) "
            "CROSS JOIN LATERAL generate_series(1, n.rows) AS i "
            "CROSS JOIN LATERAL (SELECT now() - (i::float8 / n.rows) * interval '23 hours') AS t(f)"
        )
    page.click("text=Job names")
    page.wait_for_selector("#axa-names tbody tr")

    def names() -> list[str]:
        return [cell.strip() for cell in page.locator("#axa-names tbody th").all_inner_texts()]

    # Busiest first; the slowest and the most failing at a glance.
    assert names() == ["shop.jobs.send_welcome", "shop.jobs.charge", "shop.jobs.export"]
    assert page.locator("#axa-slowest li").first.inner_text().startswith("shop.jobs.export")
    assert page.locator("#axa-failing li").first.inner_text().startswith("shop.jobs.charge 30 failed of 120")
    breadcrumbs_styled(page)
    screenshot(page, "job-names.png", docs=True)

    # Sort by the day's p95, the slowest first; again, the fastest first.
    day_p95 = page.locator('#axa-names th[data-key="day_p95"] a')
    day_p95.click()
    page.wait_for_url("**?o=-day_p95")
    assert names() == ["shop.jobs.export", "shop.jobs.charge", "shop.jobs.send_welcome"]
    assert page.locator('#axa-names th[data-key="day_p95"]').get_attribute("class") == "sortable sorted descending"
    page.locator('#axa-names th[data-key="day_p95"] a').click()
    page.wait_for_url("**?o=day_p95")
    assert names() == ["shop.jobs.send_welcome", "shop.jobs.charge", "shop.jobs.export"]

    # A name's chart: its jobs per hour over the day.
    page.locator("#axa-names tbody tr", has_text="shop.jobs.charge").get_by_text("per hour").click()
    page.wait_for_selector("#axa-chart svg")
    bars = page.locator("#axa-chart svg rect.axa-bar-ok")
    assert bars.count() == 24
    assert "failed: 30" in page.locator(".axa-legend").inner_text()
    titles = page.locator("#axa-chart svg rect.axa-bar-failed title").all_text_contents()
    assert sum(int(t.split(", ")[1].split()[0]) for t in titles) == 30
    breadcrumbs_styled(page)
    screenshot(page, "job-name.png")
    # Its name links the job list filtered by it.
    page.get_by_text("Its jobs").click()
    page.wait_for_selector("#result_list")
    assert "name=shop.jobs.charge" in page.url
