"""The Prometheus metrics view: who may read it, what a scrape holds, escaping, and no scan (issue 15, part 2)."""

import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from axa_django.ops import fleetstats
from axa_django.ops import metrics as prometheus
from axa_django.sql import refused
from tests.testapp import ops_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.ops_urls")]

URL = "/jobs/metrics"
TOKEN = "s3cret-scraper-token-0123"
needs_prometheus = pytest.mark.skipif(
    not prometheus.available(), reason="prometheus_client is not installed (pip install 'axa-django[metrics]')"
)


def settings_with(settings, **extra):
    settings.AXA_DJANGO = {**settings.AXA_DJANGO, **extra}


@pytest.fixture
def staff(django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    return user


def test_anonymous_and_non_staff_are_refused(client, django_user_model):
    response = client.get(URL)
    assert response.status_code == 403 and b"METRICS_TOKEN" in response.content
    plain = django_user_model.objects.create_user("plain", password="pw")
    client.force_login(plain)
    assert client.get(URL).status_code == 403
    staff_without_permission = django_user_model.objects.create_user("nope", password="pw", is_staff=True)
    client.force_login(staff_without_permission)
    assert client.get(URL).status_code == 403


def test_a_bearer_token_only_when_configured_and_exact(client, settings):
    assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403
    settings_with(settings, METRICS_TOKEN=TOKEN)
    assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}x"}).status_code == 403
    assert client.get(URL, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 403
    assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (200, 501)


def test_public_when_configured(client, settings):
    settings_with(settings, METRICS_PUBLIC=True)
    assert client.get(URL).status_code in (200, 501)
    assert client.post(URL).status_code == 405


@needs_prometheus
def test_a_scrape_holds_the_figures_with_every_name_escaped(client, staff):
    from prometheus_client.parser import text_string_to_metric_families

    ops_jobs.nap.using(queue="mail").perform_later(0)
    hostile = 'q"}\nfake_metric 1 # {0} %s'
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO axa_queue (id, name, args, queue, run_at) "
            "VALUES (gen_random_uuid(), 'ops.noop', '{}', %s, now() - interval '90 seconds')",
            [hostile],
        )
    client.force_login(staff)
    response = client.get(URL)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    assert "\nfake_metric 1" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ready = {s.labels["queue"]: s.value for s in families["axa_queue_jobs"].samples if s.labels["state"] == "ready"}
    assert ready == {"mail": 1.0, hostile: 1.0}
    oldest = {s.labels["queue"]: s.value for s in families["axa_queue_oldest_ready_seconds"].samples}
    assert oldest[hostile] >= 90
    jobs = {s.labels["status"]: s.value for s in families["axa_jobs"].samples}
    assert jobs == {"queued": 2.0}
    for name in (
        "axa_workers_live",
        "axa_worker_threads",
        "axa_worker_threads_busy",
        "axa_queue_finished_last_minute",
        "axa_queue_attempts_last_minute",
        "axa_claim_latency_seconds",
        "axa_run_seconds",
    ):
        assert name in families, name


@needs_prometheus
def test_the_figures_of_real_workers(client, staff, workers):
    done = [ops_jobs.nap.perform_later(0) for _ in range(5)]
    workers.start("--burst", "--concurrency", "2").wait(timeout=60)
    assert len(done) == 5
    client.force_login(staff)
    text = client.get(URL).content.decode()
    assert 'axa_queue_finished_last_minute{queue="default",status="completed"} 5.0' in text
    assert 'axa_queue_attempts_last_minute{queue="default"} 5.0' in text
    assert "axa_claim_latency_seconds " in text and "axa_run_seconds " in text


def test_without_prometheus_client_the_view_says_how_to_install_it(client, staff, monkeypatch):
    monkeypatch.setattr(prometheus, "prometheus_client", None)
    client.force_login(staff)
    response = client.get(URL)
    assert response.status_code == 501
    assert b"pip install 'axa-django[metrics]'" in response.content


def test_bad_metrics_settings_are_refused(settings):
    from django.core.exceptions import ImproperlyConfigured

    from axa_django import conf

    for key, value in [
        ("METRICS_PUBLIC", "yes"),
        ("METRICS_TOKEN", "short"),
        ("METRICS_TOKEN", " spaced-token-0123456 "),
    ]:
        settings.AXA_DJANGO = {key: value}
        with pytest.raises(ImproperlyConfigured, match=f"AXA_DJANGO\\['{key}'\\]"):
            conf.get("MODE")


@pytest.mark.parametrize(
    "statement",
    ["QUEUE_NAMES", "PER_QUEUE", "RUNNING", "FINISHED", "WORKERS", "CURRENT", "HISTORY_REFUSED"],
)
def test_every_figure_is_read_through_an_index(statement):
    params = {"queues": ["default", "mail"], "cap": fleetstats.CAP, "limit": 10}
    if statement == "QUEUE_NAMES":
        params = {"queues": fleetstats.QUEUES}
    query = refused.COUNT if statement == "HISTORY_REFUSED" else getattr(fleetstats, statement)
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a plan that still scans has no index to use
        try:
            cursor.execute("EXPLAIN " + query, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET enable_seqscan")
    assert "Seq Scan on axa_queue" not in plan, plan
