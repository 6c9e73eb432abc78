"""The job search in a real headless Chromium: type an arguments query, see exactly the jobs SQL finds."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.urls import reverse

from tests.conftest import ON_A_GIVEN_SERVER
from tests.test_admin_search import ROWS, TO_HISTORY
from tests.test_browser import page, screenshot  # noqa: F401  (the logged-in page fixture)
from tests.test_browser import pytestmark as browser_marks

pytestmark = [ON_A_GIVEN_SERVER, *browser_marks]

JOBS = reverse("admin:axa_django_job_changelist")


def test_search_by_arguments_in_the_browser(page: Any, live_server: Any) -> None:  # noqa: F811
    with connection.cursor() as cursor:
        cursor.execute(ROWS.replace("240", "60"))
        cursor.execute(TO_HISTORY)
        cursor.execute("""SELECT id::text FROM axa_queue WHERE args @> '{"user_id": 3, "vip": true}'""")
        expected = {row[0] for row in cursor.fetchall()}
    assert expected
    page.goto(f"{live_server.url}{JOBS}")
    page.fill("#searchbar", 'args.user_id:3  args.vip:true "<script>"')
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#axa-result-count")
    # The text "<script>" matches nothing; written as the box shows it and nothing ran.
    assert page.locator("#result_list").count() == 0
    assert page.input_value("#searchbar") == 'args.user_id:3  args.vip:true "<script>"'
    page.fill("#searchbar", "args.user_id:3 args.vip:true")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=args.user_id*")
    shown = set(page.locator("#result_list tbody .field-id_shown").all_inner_texts())
    assert shown == expected
    assert page.inner_text("#axa-result-count").startswith(f"{len(expected)} result")
    note = page.inner_text(".axa-search-note")
    assert "args.key:value search reads every job" in note and "add_args_index" in note
    screenshot(page, "search-args.png")
    page.fill("#searchbar", "args.1st:3")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#axa-search-problem")
    assert "'1st' in 'args.1st' is not a key" in page.inner_text("#axa-search-problem")
