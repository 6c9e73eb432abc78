"""The shop page: a form that enqueues jobs, and the latest jobs with their status."""

import json
import random

from django.contrib import messages
from django.db import transaction
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from axa_django import Job, conf

from .forms import EnqueueForm
from .samples import KINDS

RECENT = 25


def index(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = EnqueueForm(request.POST)
        if form.is_valid():
            job, make_args, _ = KINDS[form.cleaned_data["kind"]]
            count = form.cleaned_data["count"]
            rng = random.Random()
            # The rows commit with this transaction: all of them, or none if it rolls back.
            with transaction.atomic():
                for _ in range(count):
                    job.perform_later(**make_args(rng))
            messages.success(request, f"Enqueued {count} {job.__name__} jobs; a worker picks them up now.")
            return redirect("shop:index")
    else:
        form = EnqueueForm()
    return render(request, "shop/index.html", {"form": form, **jobs_context()})


def jobs_table(request: HttpRequest) -> HttpResponse:
    """The job table alone, which the page fetches again every second."""
    return render(request, "shop/jobs_table.html", jobs_context())


def jobs_context() -> dict:
    counts = dict(Job.objects.order_by().values_list("status").annotate(n=Count("id")))
    rows = []
    for job in Job.objects.order_by("-created_at", "-id")[:RECENT]:
        if job.error and job.status in (Job.Status.FAILED, Job.Status.QUEUED):  # failed, or waiting to retry
            lines = job.error.strip().splitlines()
            outcome = lines[-1] if lines else ""
        else:
            outcome = "" if job.result is None else json.dumps(job.result)
        rows.append({"job": job, "short_name": job.name.rsplit(".", 1)[-1], "outcome": outcome})
    return {
        "counts": [(s.label, s.value, counts.get(s.value, 0)) for s in Job.Status],
        "rows": rows,
        "default_attempts": conf.get("MAX_ATTEMPTS"),
    }
