"""The job lists' search syntax through Django's test client: each form against SQL of its own, its plans, its limits."""

from __future__ import annotations

import datetime
import re
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.contrib.admin import site
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from axa_django import history
from axa_django.admin import JobAdmin, lists
from axa_django.admin.lists import search_jobs
from axa_django.admin.query import SearchError, parse
from axa_django.models import Job
from axa_django.ops import searchindex
from tests.conftest import database_url

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:axa_django_job_changelist")
FAILED = reverse("admin:axa_django_failedjob_changelist")
FAILED_RETRY_MATCHING = reverse("admin:axa_django_failedjob_retry_matching")

# 240 jobs, one an hour back from now: finished ones where workers leave them (the history),
# the rest in axa_queue. Arguments nest, hold strings with spaces, booleans and nulls.
ROWS = """
INSERT INTO axa_queue (id, name, args, queue, status, error, created_at, finished_at)
SELECT gen_random_uuid(),
       CASE WHEN i % 3 = 0 THEN 'app.jobs.send_email' ELSE 'app.jobs.charge' END,
       jsonb_build_object('user_id', i % 7, 'order', jsonb_build_object('id', i), 'email', 'u ' || i % 5 || '@x',
                          'vip', i % 4 = 0, 'note', CASE WHEN i % 6 = 0 THEN NULL ELSE 'n' END),
       CASE WHEN i % 2 = 0 THEN 'mail' ELSE 'default' END,
       s.status,
       CASE WHEN s.status = 'failed' THEN
            CASE WHEN i % 4 = 0 THEN 'TimeoutError: upstream timed out' ELSE 'ValueError: bad row ' || i END END,
       now() - i * interval '1 hour',
       CASE WHEN s.status IN ('completed', 'failed') THEN now() - i * interval '1 hour' + interval '1 minute' END
FROM generate_series(1, 240) AS i
CROSS JOIN LATERAL (SELECT CASE WHEN i % 5 = 0 THEN 'failed' WHEN i % 5 = 1 THEN 'queued'
                                ELSE 'completed' END AS status) AS s
"""
TO_HISTORY = (
    "WITH moved AS (DELETE FROM ONLY axa_queue WHERE status IN ('completed', 'failed', 'cancelled') "
    "RETURNING *) INSERT INTO axa_history SELECT * FROM moved"
)


def fill(sql: str = ROWS) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.execute(TO_HISTORY)


def rows(where: str, params: Any = (), order: str = "created_at DESC") -> list[uuid.UUID]:
    """The ids SQL of our own finds, in the list's order, as many as a page shows."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM axa_queue WHERE {where} ORDER BY {order} LIMIT 50", params)
        return [row[0] for row in cursor.fetchall()]


def count(where: str, params: Any = ()) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM axa_queue WHERE {where}", params)
        return cursor.fetchone()[0]


def listed(client: Client, url: str, term: str) -> tuple[list[uuid.UUID], int, str]:
    """The ids the list shows for a search, in order, its count, and the page."""
    response = client.get(url, {"q": term})
    assert response.status_code == 200
    cl = response.context["cl"]
    return [job.pk for job in cl.result_list], cl.result_count, response.content.decode()


def shown_count(html: str) -> str:
    found = re.search(r'id="axa-result-count">([^<]*?) results?', html)
    assert found, html
    return found.group(1)


def hour_ago(hours: int) -> str:
    """A minute of the database clock ``hours`` back, as typed in the search box (UTC, the site's zone)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_char((now() - %s * interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI')", [hours]
        )
        return cursor.fetchone()[0]


def test_each_form_lists_what_sql_finds(admin_client: Client) -> None:
    fill()
    since, until = hour_ago(100), hour_ago(20)
    utc = "%s::timestamp AT TIME ZONE 'UTC'"
    forms = {
        "args.user_id:3": ("""args @> '{"user_id": 3}'""", ()),
        "args.order.id:35": ("""args @> '{"order": {"id": 35}}'""", ()),
        'args.email:"u 2@x"': ("""args @> '{"email": "u 2@x"}'""", ()),
        "args.vip:true": ("""args @> '{"vip": true}'""", ()),
        "args.note:null": ("""args @> '{"note": null}'""", ()),
        'args.user_id:"3"': ("""args @> '{"user_id": "3"}'""", ()),  # quoted: the string, which no row holds
        "name:app.jobs.send_email": ("name = 'app.jobs.send_email'", ()),
        "queue:mail": ("queue = 'mail'", ()),
        "status:failed": ("status = 'failed'", ()),
        "Status:QUEUED": ("status = 'queued'", ()),
        "error:timed": ("error ILIKE '%%timed%%'", ()),
        f"after:{since}": (f"created_at >= {utc}", [since]),
        f"before:{until}": (f"created_at < {utc}", [until]),
        f"after:{since} before:{until}": (f"created_at >= {utc} AND created_at < {utc}", [since, until]),
        "queue:mail status:failed args.vip:true": (
            """queue = 'mail' AND status = 'failed' AND args @> '{"vip": true}'""",
            (),
        ),
        "status:failed row": (
            "status = 'failed' AND (name ILIKE '%%row%%' OR args::text ILIKE '%%row%%' OR error ILIKE '%%row%%')",
            (),
        ),
        "charge": ("name ILIKE '%%charge%%' OR args::text ILIKE '%%charge%%' OR error ILIKE '%%charge%%'", ()),
    }
    jobs = JobAdmin(Job, site).get_queryset(None)  # type: ignore[arg-type]
    for term, (where, params) in forms.items():
        found = list(search_jobs(jobs, term).order_by("-created_at", "-pk").values_list("pk", flat=True)[:50])
        assert found == rows(where, params), term
        assert len(found) > 0 or term.startswith('args.user_id:"'), term
    # Through the pages, with the count each shows.
    for term in ("queue:mail status:failed args.vip:true", "error:timed", f"after:{since} before:{until}", "charge"):
        where, params = forms[term]
        ids, total, html = listed(admin_client, JOBS, term)
        assert ids == rows(where, params) and total == count(where, params) > 0, term
        assert shown_count(html) == f"{total:,}", term
    # The failed list: after: and before: bound the failure time, the list's own order.
    ids, total, html = listed(admin_client, FAILED, f"after:{since} args.vip:true")
    where = f"""status = 'failed' AND finished_at >= {utc} AND args @> '{{"vip": true}}'"""
    assert ids == rows(where, [since], order="finished_at DESC, id DESC") and total == count(where, [since]) > 0
    assert shown_count(html) == f"{total:,}"
    assert "after:2026-12-01 before:2026-12-06T10:00 (failed at)." in html  # the help says which time
    assert "before:2026-12-06T10:00 (created)." in listed(admin_client, JOBS, "queue:mail")[2]


def test_ids_and_plain_words_search_as_before(admin_client: Client) -> None:
    fill()
    [(first, name)] = Job.objects.order_by("-created_at").values_list("pk", "name")[:1]
    assert listed(admin_client, JOBS, str(first))[0] == [first]
    assert first in listed(admin_client, JOBS, str(first)[:13])[0]
    # Typed as it was (two spaces kept): one text, not two words.
    assert listed(admin_client, JOBS, "timed  out")[0] == []
    assert listed(admin_client, JOBS, "timed out")[0] == rows("error ILIKE '%%timed out%%'")
    text = "(name ILIKE %s OR args::text ILIKE %s OR error ILIKE %s)"
    assert listed(admin_client, JOBS, f"{name} status:queued")[0] == rows(
        f"status = 'queued' AND {text}", [f"%{name}%"] * 3
    )


@pytest.mark.parametrize(
    ("term", "said"),
    [
        ("colour:red", "Unknown field 'colour': the fields are name, queue, status, args, error, after, before"),
        ('args.email:"ann', "never closed"),
        ("after:yesterday", "after: takes a date or a time, as in after:2026-12-01"),
        ("before:2026-13-01", "before: takes a date or a time"),
        ("args.1st:2", "'1st' in 'args.1st' is not a key the search takes"),
        ("args.a-b:2", "'a-b' in 'args.a-b' is not a key"),
        ("args..id:2", "'' in 'args..id' is not a key"),
        ("args:42", "args needs a key"),
        ("args.user_id:", "args.user_id: needs a value"),
        ("queue:", "queue: needs a value, as in queue:mail"),
        ("status:faild", "Unknown status 'faild'"),
        ("name.x:1", "name: takes no key"),
        ("args.n:1e999", "too large a number"),
    ],
)
def test_a_malformed_search_says_why_and_runs_no_sql(admin_client: Client, term: str, said: str) -> None:
    with pytest.raises(SearchError, match=re.escape(said)):
        parse(term)
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(JOBS, {"q": term})
    assert response.status_code == 200
    html = response.content.decode()
    problem = re.search(r'id="axa-search-problem">([^<]*)<', html)
    assert problem and said.replace("'", "&#x27;").replace('"', "&quot;") in problem.group(1), html
    assert response.context["cl"].result_count == 0
    touched = [q["sql"] for q in queries.captured_queries if re.search(r'FROM "?axa_queue"?\b', q["sql"])]
    assert touched == []


def test_a_nul_in_the_search_is_refused(admin_client: Client) -> None:
    with pytest.raises(SearchError, match="NUL"):
        parse("args.a:\x00")
    response = admin_client.get(JOBS + "?q=args.a%3A%00")
    assert response.status_code == 400 and b"NUL" in response.content


@pytest.mark.parametrize(
    ("use_tz", "term", "said"),
    [
        (True, "args.user_id:" + "1" * 5000, "in args.user_id: is a number of 5,000 digits, more than 4,300"),
        (False, "after:0001-01-01T00:00+14:00", "after:0001-01-01T00:00+14:00 falls outside the years 1 to 9999"),
        (False, "before:9999-12-31T23:00-12:00", "before:9999-12-31T23:00-12:00 falls outside the years 1 to 9999"),
    ],
)
def test_a_number_past_pythons_digits_or_a_time_past_the_calendar_is_a_message_on_each_page(
    admin_client: Client, use_tz: bool, term: str, said: str
) -> None:
    # Before: json.loads' int digit limit (ValueError) and make_naive (OverflowError) were 500s.
    with override_settings(USE_TZ=use_tz, TIME_ZONE="UTC"):
        with pytest.raises(SearchError, match=re.escape(said)):
            parse(term)
        for url in (JOBS, FAILED):
            response = admin_client.get(url, {"q": term})
            assert response.status_code == 200 and response.context["cl"].result_count == 0, url
            problem = re.search(r'id="axa-search-problem">([^<]*)<', response.content.decode())
            assert problem and said.replace("'", "&#x27;") in problem.group(1), url
        for list_name in ("job", "failedjob"):
            confirm = reverse("admin:axa_django_bulkoperation_start", args=[list_name, "retry"])
            response = admin_client.get(confirm, {"q": term}, follow=True)
            shown = [str(m) for m in response.context["messages"]]
            assert response.status_code == 200 and any(said in m and "Nothing was changed" in m for m in shown)


def test_retry_all_matching_refuses_a_malformed_search(admin_client: Client) -> None:
    with connection.cursor() as cursor:
        cursor.execute(ROWS.replace("240", "10"))
    failed = count("status = 'failed'")
    response = admin_client.post(FAILED_RETRY_MATCHING + "?q=colour:red", {"post": "yes"}, follow=True)
    assert any(
        "Unknown field 'colour'" in str(m) and "Nothing was changed" in str(m) for m in response.context["messages"]
    )
    assert count("status = 'failed'") == failed > 0


def test_terms_with_like_wildcards_quotes_and_backslashes_match_only_themselves(admin_client: Client) -> None:
    texts = ["100% done", "1000 done", "a_b", "axb", 'say "hi"', "say hi", "C:\\dir", "C:dir"]
    with connection.cursor() as cursor:
        for text in texts:
            cursor.execute(
                "INSERT INTO axa_queue (id, name, args, status, error) VALUES (gen_random_uuid(), 'app.t', "
                "jsonb_build_object('text', %s::text), 'failed', %s)",
                [text, text],
            )

    def errors(term: str) -> set[str]:
        ids = listed(admin_client, JOBS, term)[0]
        return set(Job.objects.filter(pk__in=ids).values_list("error", flat=True))

    assert errors('error:"100%"') == {"100% done"}
    assert errors("error:a_b") == {"a_b"}
    assert errors(r'error:"say \"hi\""') == {'say "hi"'}
    assert errors(r'error:"C:\\dir"') == {"C:\\dir"}
    assert errors("100%") == {"100% done"}
    assert errors('"a_b"') == {"a_b"}
    assert errors(r'args.text:"say \"hi\""') == {'say "hi"'}
    assert errors(r'args.text:"C:\\dir"') == {"C:\\dir"}
    assert errors('args.text:"100% done"') == {"100% done"}
    # Shown back escaped: the term in the search box, the problem in the note.
    html = listed(admin_client, JOBS, 'colour:"<b>x</b>"')[2]
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def args_plan(client: Client, term: str) -> str:
    cl = client.get(JOBS, {"q": term}).context["cl"]
    return cl.queryset[: cl.list_per_page].explain()


def tree() -> list[str]:
    """axa_queue and the tables under it (other tests may have left a rotation's tables)."""
    with connection.cursor() as cursor:
        cursor.execute(searchindex.TABLES)
        return [table for table, _ in cursor.fetchall()]


def test_the_args_form_uses_the_opt_in_index_on_every_table_and_says_when_it_cannot(admin_client: Client) -> None:
    fill(ROWS.replace("240", "4000").replace("i % 7", "i"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE axa_queue")
        cursor.execute("ANALYZE axa_history")
    html = listed(admin_client, JOBS, "args.user_id:42")[2]
    note = re.search(r'class="axa-search-note">([^<]*)<', html)
    assert note and note.group(1).startswith("args.key:value search reads every job: "), html
    assert f"{', '.join(sorted(tree()))} have no index for it" in note.group(1)
    assert "searchindex.add_args_index" in note.group(1) and "the page stops it after 5 s" in note.group(1)
    assert "args_path" not in args_plan(admin_client, "args.user_id:42")

    with connection.schema_editor() as editor:
        built = searchindex.create(editor, searchindex.ARGS)
    with connection.cursor() as cursor:
        cursor.execute("SELECT number FROM axa_history_part WHERE opened_at IS NOT NULL AND closed_at IS NULL")
        (number,) = cursor.fetchone()
        cursor.execute("ANALYZE axa_history")
    assert built[0] == "axa_queue_args_path" and f"axa_history_{number}_args_path" in built
    assert len(built) == len(tree())
    ids, total, html = listed(admin_client, JOBS, "args.user_id:42")
    assert ids == rows("""args @> '{"user_id": 42}'""") and total == 1
    assert 'class="axa-search-note"' not in html
    plan = args_plan(admin_client, "args.user_id:42")
    assert f"Bitmap Index Scan on axa_history_{number}_args_path" in plan, plan
    assert "Bitmap Index Scan on axa_queue_args_path" in plan, plan
    nested = args_plan(admin_client, "args.order.id:7 status:completed")
    assert f"Bitmap Index Scan on axa_history_{number}_args_path" in nested, nested

    # A rotation after the opt-in: the table it makes copies axa_queue's index.
    with connection.cursor() as cursor:
        history.prepare(cursor)  # (a table another test prepared was indexed above)
        assert history.close(cursor, datetime.timedelta(0)) == number
        assert history.prepare(cursor)
        cursor.execute("SELECT number FROM axa_history_part WHERE opened_at IS NULL")
        (made,) = cursor.fetchone()
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'axa_history_next'")
        assert f"axa_history_{made}_args_path" in {row[0] for row in cursor.fetchall()}
        assert searchindex.missing(cursor, searchindex.ARGS) == []
    # Made again, nothing is built twice; dropped, no table keeps it.
    with connection.schema_editor() as editor:
        assert searchindex.create(editor, searchindex.ARGS) == []
        assert len(searchindex.drop(editor, searchindex.ARGS)) == len(tree())
    with connection.cursor() as cursor:
        assert searchindex.missing(cursor, searchindex.ARGS) == sorted(tree())


def test_error_and_text_forms_say_they_read_every_job_until_trigram_indexes_exist(admin_client: Client) -> None:
    fill(ROWS.replace("240", "10"))
    notes = listed(admin_client, JOBS, "error:timed")[2]
    assert "error: search reads every job" in notes and "add_trigram_indexes" in notes
    assert "Text search reads every job" in listed(admin_client, JOBS, "timed")[2]
    assert 'class="axa-search-note"' not in listed(admin_client, JOBS, "queue:mail status:failed")[2]
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")  # rolled back with the test
    with connection.schema_editor() as editor:
        assert len(searchindex.create(editor, *searchindex.TRIGRAMS)) == 3 * len(tree())
    assert 'class="axa-search-note"' not in listed(admin_client, JOBS, "error:timed")[2]
    ids, _, html = listed(admin_client, JOBS, "timed")
    assert 'class="axa-search-note"' not in html and ids == rows("error ILIKE '%%timed%%'")


def test_a_search_past_its_time_is_stopped_and_says_so(admin_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists, "SEARCH_SECONDS", 0.3)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = '20s'")  # a regression fails here rather than hangs
    # Another session holds the history table: the search waits for it past its bound.
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SET lock_timeout = '5s'")
        with other.transaction():
            other.execute("LOCK TABLE axa_history IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            response = admin_client.get(JOBS, {"q": "args.user_id:1"})
            waited = time.monotonic() - started
    html = response.content.decode()
    assert response.status_code == 200 and 0.3 <= waited < 3, waited
    assert 'id="axa-search-stopped">The search was stopped after 0.3 s' in html
    assert 'value="args.user_id:1"' in html  # the search stays in the box, to narrow it
    assert response.context["cl"].result_count == 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "20s"  # the bound ended with the page
    assert admin_client.get(JOBS, {"q": "args.user_id:1"}).context["cl"].search_stopped is False
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "20s"  # set back after a search that answered too
