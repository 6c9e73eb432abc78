"""The Job names page (issue 47): every figure against SQL over the rows, kept spans, sorting, escaping, access."""

from __future__ import annotations

import json
import re
import threading
import zoneinfo
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.test import Client, override_settings
from django.urls import reverse

from axa_django.admin import names as names_admin
from axa_django.models import NameSpan, NameStat
from axa_django.ops import names
from tests.conftest import database_url, wait_for

pytestmark = pytest.mark.django_db

PAGE = reverse("admin:axa_django_jobnames_changelist")
NAME = reverse("admin:axa_django_jobnames_name")
JOBS = reverse("admin:axa_django_job_changelist")
HOSTILE = ["<script>alert('n')</script>", "x'); DROP TABLE axa_queue; --", "{0} %s %(x)s {{ x }} \u202e&amp;"]

# The windows as the page defines them, in plain SQL: the last hour is the twelve 5-minute
# slots up to now, the day the 24 clock hours (UTC) up to now.
EXACT = """
WITH w AS (
    SELECT 'hour' AS window, date_bin('5 minutes', now(), timestamptz '2000-01-01 00:00+00') - interval '55 minutes' AS since
    UNION ALL SELECT 'day', date_trunc('hour', now(), 'UTC') - interval '23 hours'
)
SELECT q.name, w.window, count(*) FILTER (WHERE q.status = 'completed'), count(*) FILTER (WHERE q.status = 'failed'),
       count(*) FILTER (WHERE q.attempts > 1 OR q.losses > 0),
       percentile_disc(0.5) WITHIN GROUP (ORDER BY date_part('epoch', q.finished_at - q.started_at)),
       percentile_disc(0.95) WITHIN GROUP (ORDER BY date_part('epoch', q.finished_at - q.started_at)),
       max(date_part('epoch', q.finished_at - q.started_at))
FROM axa_queue q JOIN w ON q.finished_at >= w.since
WHERE q.status IN ('completed', 'failed')
GROUP BY q.name, w.window
"""


def finish(name: str, ago: str, seconds: str, rows: int = 1, status: str = "completed", **fields: Any) -> None:
    """``rows`` finished jobs in the history, ``ago`` before now; ``seconds`` an SQL expression of ``i`` (1..rows)."""
    fields = {"attempts": 1, **fields}
    extra = "".join(f", {key}" for key in fields)
    values = "".join(", %s" for _ in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO axa_history (id, name, args, status, started_at, finished_at{extra}) "
            f"SELECT gen_random_uuid(), %s, '{{}}', %s, now() - %s::interval - make_interval(secs => {seconds}), "
            f"now() - %s::interval{values} FROM generate_series(1, %s) AS i",
            [name, status, ago, ago, *fields.values(), rows],
        )


def exact() -> dict[tuple[str, str], tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(EXACT)
        return {(row[0], row[1]): row[2:] for row in cursor.fetchall()}


def assert_figures_match(found: list[names.NameFigures], expected: dict[tuple[str, str], tuple[Any, ...]]) -> None:
    assert sorted(f.name for f in found) == sorted({name for name, _ in expected})
    for figures in found:
        for window in ("hour", "day"):
            shown: names.Window = getattr(figures, window)
            if (figures.name, window) not in expected:
                assert (shown.run, shown.p50, shown.longest) == (0, None, None), (figures.name, window)
                continue
            completed, failed, retried, p50, p95, longest = expected[figures.name, window]
            where = (figures.name, window)
            assert (shown.completed, shown.failed, shown.retried, shown.longest) == (
                completed,
                failed,
                retried,
                longest,
            ), where
            for estimate, value in ((shown.p50, p50), (shown.p95, p95)):
                assert value is not None and estimate is not None, where
                bound = names.LOWEST / 2 if value < names.LOWEST else value * names.ERROR
                assert abs(estimate - value) <= bound * (1 + 1e-9), (where, estimate, value)


def a_day_of_jobs() -> None:
    """Jobs over the last day in three names: in kept hours, kept slots and the last minutes; some outside."""
    finish("alpha", "20 hours", "i * 0.013", rows=40)
    finish("alpha", "3 hours", "0.5 + i * 0.2", rows=10, status="failed", attempts=3)
    finish("alpha", "40 minutes", "i * 0.0007", rows=25, losses=1)
    finish("alpha", "1 minute", "2 + i", rows=3)
    finish("alpha", "2 minutes", "0", rows=2, status="cancelled")  # not counted
    finish("alpha", "30 hours", "1", rows=5)  # before the day
    finish("beta", "25 minutes", "0.00002 * i", rows=7, status="failed")
    finish("beta", "90 seconds", "40", rows=1)
    finish("gamma", "22 hours 30 minutes", "3600 * i", rows=2)
    with connection.cursor() as cursor:  # a job that never started: counted, not timed
        cursor.execute(
            "INSERT INTO axa_history (id, name, args, status, finished_at, attempts) "
            "VALUES (gen_random_uuid(), 'gamma', '{}', 'failed', now() - interval '5 hours', 0)"
        )


def test_every_figure_matches_sql_over_the_rows_and_past_spans_are_kept_once(admin_client: Client, caplog) -> None:
    a_day_of_jobs()
    expected = exact()
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    shown = {row["figures"].name: row for row in response.context["rows"]}
    assert_figures_match([row["figures"] for row in shown.values()], expected)
    assert shown["gamma"]["figures"].day.failed == 1 and "gamma" not in {n for n, w in expected if w == "hour"}
    html = response.content.decode()
    assert f'href="{JOBS}?name=alpha"' in html and "2 job names" not in html and "3 job names" in html

    # Every past hour and slot that settled is kept, the empty ones too, and the day's
    # hours rolled up once the last of them is kept.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM generate_series(date_trunc('hour', now(), 'UTC') - interval '23 hours', "
            "date_trunc('hour', now(), 'UTC') - interval '1 hour', interval '1 hour') g "
            "WHERE g + interval '1 hour' + %(s)s <= now()), "
            "(SELECT count(*) FROM generate_series(date_trunc('hour', now(), 'UTC') - interval '1 hour', now(), "
            "interval '5 minutes') g WHERE g + interval '5 minutes' + %(s)s <= now()), "
            "date_trunc('hour', now(), 'UTC') + %(s)s <= now()",
            {"s": names.SETTLE},
        )
        hours, slots, rolled = cursor.fetchone()
    kept = [span.minutes for span in NameSpan.objects.all()]
    assert (kept.count(60), kept.count(5), kept.count(names.DAY_MINUTES)) == (hours, slots, int(rolled))
    # The day read hour by hour gives what the roll-up gives.
    with connection.cursor() as cursor:
        cursor.execute(names.SUMMARY, {"names": None, "whole": True})
        whole = sorted(cursor.fetchall())
        cursor.execute(names.SUMMARY, {"names": None, "whole": False})
        assert sorted(cursor.fetchall()) == whole

    # A kept span is read, not counted again: jobs pruned (or retried) since still count
    # where they finished; the last minutes are counted at each load.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM axa_queue WHERE name = 'alpha' AND finished_at < now() - interval '10 hours'")
        assert cursor.rowcount == 45
    finish("alpha", "30 seconds", "1", rows=1, status="failed")
    again = {f.name: f for f in names.collect().names}
    assert again["alpha"].day.run == shown["alpha"]["figures"].day.run + 1
    assert again["alpha"].hour.failed == shown["alpha"]["figures"].hour.failed + 1

    # A database the page may not write to: the same figures, counted from the rows.
    NameStat.objects.all().delete()
    NameSpan.objects.all().delete()
    expected = exact()
    names._KEEP_REFUSED.discard("default")
    for _ in range(2):  # said once: a read-only user is refused at every load
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
            found = names.collect()
    assert_figures_match(found.names, expected)
    assert not NameSpan.objects.exists()
    warned = [r for r in caplog.records if "could not keep its past spans" in r.getMessage()]
    assert [r.levelname for r in warned] == ["WARNING"] and "read-only" in warned[0].getMessage()


def test_a_load_reads_only_the_last_minutes_rows_through_the_finished_index() -> None:
    for hours in range(1, 23):
        finish("busy", f"{hours} hours 7 minutes", "0.01 * i", rows=30)
    finish("busy", "20 minutes", "0.01", rows=30)
    finish("busy", "1 minute", "0.01", rows=3)
    names.collect()  # keeps every settled span
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny table is read whole otherwise
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + names.SUMMARY, {"names": None, "whole": True})
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    reads = [n for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") in ("axa_queue", "axa_history")]
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in reads) == 3, reads
    # The history through its finished_at index (an index scan, or a bitmap of it), never whole.
    assert not [n for n in reads if n["Node Type"] == "Seq Scan" and n["Relation Name"] == "axa_history"], reads
    used = {n.get("Index Name", "") for n in nodes(plan[0]["Plan"])}
    assert any(re.fullmatch(r"axa_history_\d+_finished", index) for index in used), used


def test_bins_agree_with_the_sql_and_every_estimate_is_within_the_stated_bound() -> None:
    values = [0.0, 0.00005, 0.0001, 0.000118, 0.001, 0.05, 0.99, 1.0, 3.7, 59.0, 3600.0, 86400.0, 200000.0]
    sql = names._BIN.replace("q.started_at IS NULL", "false").replace(names._SECONDS, "v")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT v, {sql} FROM unnest(%s::float8[]) AS v", [values])
        assert {value: b for value, b in cursor.fetchall()} == {value: names.bin_of(value) for value in values}
    for value in values[:-1]:  # the top bin is open: its estimate is the longest run
        estimate = names.estimate(names.bin_of(value), longest=10**9)
        assert estimate is not None
        bound = names.LOWEST / 2 if value < names.LOWEST else value * names.ERROR
        assert abs(estimate - value) <= bound * (1 + 1e-9), (value, estimate)
    assert names.estimate(names.bin_of(3.7), longest=3.0) == 3.0  # never above the longest run
    assert round(names.ERROR, 4) == 0.0905
    assert names.percentile_bin([3, 7, 9], [1, 18, 1], 95) == 7 and names.percentile_bin([3, 7, 9], [1, 18, 2], 95) == 9


def test_many_names_render_sort_and_page(admin_client: Client) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_history (id, name, args, status, started_at, finished_at, attempts) "
            "SELECT gen_random_uuid(), 'app.jobs.n' || lpad(n::text, 4, '0'), '{}', "
            "CASE WHEN i = 1 AND n % 7 = 0 THEN 'failed' ELSE 'completed' END, "
            "now() - interval '2 hours' - make_interval(secs => n * 0.01 * i), now() - interval '2 hours', 1 "
            "FROM generate_series(1, 1000) AS n, generate_series(1, 3) AS i"
        )
    response = admin_client.get(PAGE)
    html = response.content.decode()
    assert "1,000 job names" in html and len(response.context["rows"]) == names_admin.PER_PAGE
    assert [n for n, _ in response.context["pages"]] == list(range(1, 11))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed'), "
            "percentile_disc(0.95) WITHIN GROUP (ORDER BY date_part('epoch', finished_at - started_at)) "
            "FROM axa_queue GROUP BY name"
        )
        exact_rows = {name: (completed, failed, p95) for name, completed, failed, p95 in cursor.fetchall()}
        cursor.execute(
            "SELECT name FROM axa_queue WHERE status = 'failed' GROUP BY name ORDER BY count(*) DESC, name LIMIT 5"
        )
        most_failing = [row[0] for row in cursor.fetchall()]
    for row in response.context["rows"]:
        figures = row["figures"]
        assert (figures.day.completed, figures.day.failed) == exact_rows[figures.name][:2], figures.name
    assert [row["figures"].name for row in response.context["failing"]] == most_failing
    # Sorted by the day's p95, the slowest first: the top row is the slowest by the exact p95
    # too, within the histogram's bound; each header links to its sort, the current one turned round.
    response = admin_client.get(PAGE, {"o": "-day_p95"})
    slowest = [row["figures"] for row in response.context["rows"]]
    assert [f.day.p95 for f in slowest] == sorted((f.day.p95 for f in slowest), reverse=True)
    top = max(p95 for _, _, p95 in exact_rows.values())
    assert exact_rows[slowest[0].name][2] * (1 + names.ERROR) ** 2 >= top == 30.0
    headers = {h["key"]: h for h in response.context["headers"]}
    assert headers["day_p95"]["url"] == "?o=day_p95" and headers["day_p95"]["sorted"] == "descending"
    assert headers["hour_failed"]["url"] == "?o=-hour_failed" and headers["name"]["url"] == "?o=name"
    by_name = admin_client.get(PAGE, {"o": "name", "p": "10"}).context["rows"]
    assert [row["figures"].name for row in by_name][-1] == "app.jobs.n1000"
    assert admin_client.get(PAGE, {"o": "-name"}).context["rows"][0]["figures"].name == "app.jobs.n1000"


def test_names_that_look_like_markup_sql_or_format_strings_are_shown_as_text(admin_client: Client) -> None:
    for name in HOSTILE:
        finish(name, "40 minutes", "0.2", rows=2, status="failed")
    html = admin_client.get(PAGE).content.decode()
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#x27;n&#x27;)&lt;/script&gt;" in html
    assert "x&#x27;); DROP TABLE axa_queue; --" in html and "{0} %s %(x)s {{ x }}" in html
    assert "&amp;amp;" in html and f'href="{JOBS}?{urlencode({"name": HOSTILE[0]})}"' in html
    for name in HOSTILE:
        response = admin_client.get(NAME, {"name": name})
        assert response.status_code == 200 and response.context["row"]["figures"].day.failed == 2
        page = response.content.decode()
        assert "<svg" in page and "<script>alert" not in page and "2 failed" in page


def test_a_names_chart_counts_its_jobs_per_hour(admin_client: Client) -> None:
    a_day_of_jobs()
    response = admin_client.get(NAME, {"name": "alpha"})
    assert_figures_match([response.context["row"]["figures"]], {k: v for k, v in exact().items() if k[0] == "alpha"})
    hours = response.context["row"]["figures"].hours
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT date_trunc('hour', finished_at, 'UTC'), count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status = 'failed') FROM axa_queue WHERE name = 'alpha' "
            "AND status IN ('completed', 'failed') AND finished_at >= date_trunc('hour', now(), 'UTC') - interval '23 hours' "
            "GROUP BY 1"
        )
        expected = {hour: (completed, failed) for hour, completed, failed in cursor.fetchall()}
    assert len(hours) == 24 and {h.start: (h.completed, h.failed) for h in hours if h.completed or h.failed} == expected
    assert hours == sorted(hours, key=lambda h: h.start)
    html = response.content.decode()
    assert "<rect" in html and f'href="{JOBS}?name=alpha"' in html
    missing = admin_client.get(NAME, {"name": "nobody"})
    assert missing.status_code == 200 and "No job named &#x27;nobody&#x27; finished in the last day." in (
        missing.content.decode()
    )


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ=True", "USE_TZ=False"])
def test_local_times_with_and_without_time_zone_support(admin_client: Client, use_tz: bool) -> None:
    finish("alpha", "3 hours", "1", rows=2)
    with override_settings(USE_TZ=use_tz, TIME_ZONE="America/New_York"):
        response = admin_client.get(PAGE)
        chart = admin_client.get(NAME, {"name": "alpha"})
    assert response.status_code == 200 and chart.status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_trunc('hour', now(), 'UTC') - interval '23 hours'")
        day_from = cursor.fetchone()[0].astimezone(zoneinfo.ZoneInfo("America/New_York"))
    assert f"since {day_from:%b} {day_from.day} {day_from:%H:%M}" in response.content.decode()
    labels = re.findall(r'<text x="[\d.]+" y="\d+" text-anchor="middle">(\d\d:00)</text>', chart.content.decode())
    assert labels[0] == f"{day_from:%H}:00" and len(labels) == 8  # the chart's hours, in New York


def test_seeing_the_page_needs_view_job(client: Client) -> None:
    assert client.get(PAGE).status_code == 302  # the admin's login
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(PAGE).status_code == 403 and client.get(NAME, {"name": "x"}).status_code == 403
    assert f'href="{PAGE}"' not in client.get(reverse("admin:index")).content.decode()
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(User.objects.get(pk=user.pk))
    assert client.get(PAGE).status_code == 200 and client.get(NAME, {"name": "x"}).status_code == 200
    index = client.get(reverse("admin:index")).content.decode()
    assert f'href="{PAGE}"' in index and "Job names" in index
    assert client.post(PAGE).status_code == 405


def test_bad_parameters_get_a_message_or_a_400(admin_client: Client) -> None:
    finish("alpha", "3 hours", "1", rows=2)
    assert admin_client.get(PAGE + "?o=%00").status_code == 400
    assert admin_client.get(PAGE + "?p=1%00").status_code == 400
    assert admin_client.get(NAME + "?name=a%00b").status_code == 400
    for order in ("bogus", "--day_p95", "day_p95;drop", ""):
        response = admin_client.get(PAGE, {"o": order})
        messages = [str(m) for m in response.context["messages"]]
        assert response.status_code == 200 and messages == [
            f"There is no column {order!r} to sort by; sorted by jobs run in the last day instead."
        ], order
        assert response.context["rows"][0]["figures"].name == "alpha"
    for page in ("0", "2", "x", "-1", "\u00b2", "9" * 40):
        response = admin_client.get(PAGE, {"p": page})
        assert [str(m) for m in response.context["messages"]] == [
            f"There is no page {page!r} (pages 1 to 1); showing page 1."
        ]


def test_old_spans_are_forgotten() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_name_span (minutes, start) VALUES (60, now() - interval '8 days'), "
            "(60, date_trunc('hour', now(), 'UTC') - interval '6 days'), (5, now() - interval '4 hours'), "
            "(%s, now() - interval '2 days')",
            [names.DAY_MINUTES],
        )
        cursor.execute(
            "INSERT INTO axa_name_stat SELECT minutes, start, 'x', 1, 0, 0, 1.0, '{40}', '{1}' FROM axa_name_span"
        )
    names.collect()
    assert list(NameStat.objects.values_list("minutes", flat=True)) == [60]  # the 6-day-old hour
    with connection.cursor() as cursor:
        cursor.execute("SELECT minutes FROM axa_name_span WHERE start < now() - interval '1 day'")
        assert cursor.fetchall() == [(60,)]


@pytest.mark.django_db(transaction=True)
def test_two_loads_at_once_count_each_span_once() -> None:
    finish("alpha", "5 hours", "0.1 * i", rows=20)
    finish("beta", "30 minutes", "0.1 * i", rows=4, status="failed")
    url = database_url()
    with psycopg.connect(url) as first, psycopg.connect(url) as second:
        params = {"settle": names.SETTLE}
        kept = first.execute(names.KEEP, params).rowcount
        assert kept >= 2  # alpha's hour and slot rows, beta's slot
        pid = second.execute("SELECT pg_backend_pid()").fetchone()[0]
        counted: list[int] = []
        worker = threading.Thread(target=lambda: counted.append(second.execute(names.KEEP, params).rowcount))
        worker.start()
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_for(
                lambda: watcher.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()[0],
                what="the second load to wait for the first's marks",
            )
        first.commit()
        worker.join(timeout=30)
        second.commit()
    assert counted == [0]
    rows = {(s.minutes, s.name): (s.completed, s.failed) for s in NameStat.objects.all()}
    assert rows[(60, "alpha")] == (20, 0) and rows[(5, "beta")] == (0, 4)
    assert NameStat.objects.filter(name="alpha").count() == 1  # its hour, once
