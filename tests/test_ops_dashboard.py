"""The live dashboard: its JSON poll (who may read it, what it holds), the page's script (issue 15, part 4)."""

import json
import re

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.urls import reverse

from axa_django import Job
from tests.conftest import wait_for
from tests.testapp import ops_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.ops_urls")]

HOSTILE = "<script>alert('q')</script>\"&"


def data_url() -> str:
    return reverse("admin:axa_django_queuedashboard_data")


def page_url() -> str:
    return reverse("admin:axa_django_queuedashboard_changelist")


def test_the_poll_is_for_staff_who_may_view_jobs(client, django_user_model):
    response = client.get(data_url())
    assert response.status_code == 302 and "/login/" in response["Location"]  # the admin's own gate
    staff = django_user_model.objects.create_user("nope", password="pw", is_staff=True)
    client.force_login(staff)
    response = client.get(data_url())
    assert response.status_code == 403 and response.json() == {"error": "you may not view jobs"}
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    response = client.get(data_url())
    assert response.status_code == 200 and response["Cache-Control"].startswith("max-age=0")
    assert client.post(data_url()).status_code == 405


def test_the_poll_outside_the_admin_refuses_anonymous_unless_public(client, settings):
    response = client.get("/jobs/dashboard.json")
    assert response.status_code == 403 and "METRICS_PUBLIC" in response.json()["error"]
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, "METRICS_PUBLIC": True}
    assert client.get("/jobs/dashboard.json").json()["statuses"] == {}


def test_the_poll_holds_queues_and_workers_with_their_current_jobs(admin_client, workers):
    ops_jobs.nap.using(queue="mail").perform_later(0)
    ops_jobs.nap.using(queue="mail").perform_later(0)
    workers.start("--concurrency", "2", "--queue", "default")
    napping = ops_jobs.nap.perform_later(30)
    wait_for(lambda: Job.objects.get(pk=napping.pk).status == "running", what="the nap to start")
    data = admin_client.get(data_url()).json()
    queues = {q["queue"]: q for q in data["queues"]}
    assert (queues["mail"]["ready"], queues["mail"]["running"]) == (2, 0)
    assert (queues["default"]["ready"], queues["default"]["running"]) == (0, 1)
    (worker,) = data["workers"]
    assert worker["alive"] and worker["queues"] == ["default"] and worker["concurrency"] == 2
    assert [(j["name"], j["id"], j["attempt"]) for j in worker["jobs"]] == [("ops.sleep", str(napping.pk), 1)]
    assert (data["live_workers"], data["threads"], data["threads_busy"]) == (1, 2, 1)
    assert data["ready"] == 2 and data["refresh_seconds"] == 5 and data["took_ms"] >= 0
    html = admin_client.get(page_url()).content.decode()
    assert "<code>ops.sleep</code>" in html and "<td>mail</td><td>2</td>" in html


def test_names_are_escaped_on_the_page_and_data_in_the_poll(admin_client):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue) VALUES (gen_random_uuid(), %s, '{}', %s)",
            [HOSTILE, HOSTILE],
        )
    html = admin_client.get(page_url()).content.decode()
    assert HOSTILE not in html and "&lt;script&gt;alert(&#x27;q&#x27;)&lt;/script&gt;&quot;&amp;" in html
    response = admin_client.get(data_url())
    assert response["Content-Type"] == "application/json"
    assert [q["queue"] for q in json.loads(response.content)["queues"]] == [HOSTILE]


def test_the_page_polls_with_no_external_assets_and_pauses_when_hidden(admin_client):
    html = admin_client.get(page_url()).content.decode()
    assert f'data-url="{data_url()}"' in html and 'data-every="5"' in html
    for asked, every in [("2", "2"), ("0", "5"), ("61", "5"), ("x", "5"), ("-1", "5"), ("\u00b2", "5")]:
        page = admin_client.get(page_url(), {"refresh": asked}).content.decode()
        assert f'data-every="{every}"' in page, asked
    script = "".join(re.findall(r"<script>(.*?)</script>", html, re.S))  # the page's and the live refresh's
    assert "visibilitychange" in script and "document.hidden" in script and "textContent" in script
    assert "innerHTML" not in script and "http://" not in script and "https://" not in script
    # Only the admin's own scripts and styles load: nothing from another host.
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_a_paused_queue_shows_as_paused_on_the_page_and_in_the_poll(admin_client):
    from axa_django import queues

    ops_jobs.nap.using(queue="emails").perform_later(0)
    queues.pause("emails", reason="incident")
    queues.pause("idle-but-paused")
    poll = {q["queue"]: q["paused"] for q in json.loads(admin_client.get(data_url()).content)["queues"]}
    assert poll["emails"] is True and poll["idle-but-paused"] is True
    assert not any(paused for name, paused in poll.items() if name not in ("emails", "idle-but-paused"))
    html = admin_client.get(page_url()).content.decode()
    row = re.search(r"<tr><td>emails</td>.*?</tr>", html).group(0)
    assert "<td>paused</td>" in row
