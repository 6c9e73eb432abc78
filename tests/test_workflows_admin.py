"""The admin of workflows: a job's parents and children as links, the workflow page with counts, the waiting filter."""

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.test import Client
from django.urls import reverse

from axa_django import Job, workflow
from tests.test_admin import user_with
from tests.testapp import workflow_jobs as wj

pytestmark = pytest.mark.django_db


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def job_url(job: Any) -> str:
    return reverse("admin:axa_django_job_change", args=[job.pk])


def make_diamond() -> tuple[Any, list[Job]]:
    with workflow("nightly <b>import</b>") as wf:
        a = wf.add(wj.noop, 1)
        b = wf.add(wj.noop, 2, after=[a])
        c = wf.add(wj.noop, 3, after=[a])
        d = wf.add(wj.noop, 4, after=[b, c], on_parent_failure="run")
    return wf, [a, b, c, d]


def test_a_job_page_links_its_parents_children_and_workflow(admin_client: Client) -> None:
    wf, (a, b, c, d) = make_diamond()
    html = page(admin_client, job_url(d))
    assert f'href="{job_url(b)}"' in html and f'href="{job_url(c)}"' in html
    assert reverse("admin:axa_django_workflow_change", args=[wf.id]) in html
    assert "nightly &lt;b&gt;import&lt;/b&gt;" in html  # the name is text, never markup
    assert "run anyway" in html
    html = page(admin_client, job_url(a))
    assert f'href="{job_url(b)}"' in html and f'href="{job_url(c)}"' in html
    # A job of no workflow shows no such section.
    assert "field-parents_shown" not in page(admin_client, job_url(wj.noop.perform_later(9)))


def test_a_fan_in_page_shows_some_parents_and_counts_the_rest(admin_client: Client) -> None:
    parents = wj.noop.perform_later_many([{"i": i} for i in range(25)])
    child = wj.noop.using(after=parents).perform_later(0)
    html = page(admin_client, job_url(child))
    assert html.count('href="/admin/axa_django/job/') >= 20 and "and 5 more" in html


def test_the_workflow_page_counts_jobs_by_status_with_links(admin_client: Client) -> None:
    wf, (a, b, _c, _d) = make_diamond()
    Job.objects.filter(pk=a.pk).update(status="completed")
    html = page(admin_client, reverse("admin:axa_django_workflow_change", args=[wf.id]))
    jobs = reverse("admin:axa_django_job_changelist")
    assert f"{jobs}?workflow_id__exact={wf.id}&amp;status__exact=waiting" in html
    listing = page(admin_client, reverse("admin:axa_django_workflow_changelist"))
    assert str(wf.id) in listing and "waiting" in listing
    filtered = page(admin_client, f"{jobs}?workflow_id__exact={wf.id}&status__exact=waiting")
    assert filtered.count(str(b.pk)) >= 1 and str(a.pk) not in filtered


def test_waiting_is_a_status_filter_of_the_job_list(admin_client: Client) -> None:
    parent = wj.noop.perform_later(1)
    child = wj.noop.using(after=[parent]).perform_later(2)
    html = page(admin_client, reverse("admin:axa_django_job_changelist") + "?status__exact=waiting")
    assert "?status__exact=waiting" in html
    assert str(child.pk) in html and str(parent.pk) not in html


def test_cancelling_a_workflow_from_its_list_needs_the_cancel_permission(admin_client: Client) -> None:
    wf, _jobs = make_diamond()
    url = reverse("admin:axa_django_workflow_changelist")
    data = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(wf.id)], "index": "0"}
    viewer = user_with("view_job")
    viewer.post(url, data, follow=True)
    assert Job.objects.filter(workflow_id=wf.id, status="cancelled").count() == 0
    response = admin_client.post(url, data, follow=True)
    assert "4 job(s) cancelled" in response.content.decode()
    assert set(Job.objects.filter(workflow_id=wf.id).values_list("status", flat=True)) == {"cancelled"}


def test_the_detail_page_offers_cancel_for_a_waiting_job(admin_client: Client) -> None:
    parent = wj.noop.perform_later(1)
    child = wj.noop.using(after=[parent]).perform_later(2)
    assert reverse("admin:axa_django_job_cancel", args=[child.pk]) in page(admin_client, job_url(child))
