"""Views: the Prometheus metrics view and the dashboard's live JSON; staff only unless configured public."""

from __future__ import annotations

import hmac

import psycopg
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from . import conf
from .ops import dashboard, fleetstats
from .ops import metrics as prometheus

REFUSED = (
    "The queue's metrics are for staff users with view permission on jobs, a scraper sending "
    "'Authorization: Bearer <AXA_DJANGO['METRICS_TOKEN']>', or anyone once AXA_DJANGO['METRICS_PUBLIC'] = True."
)


def may_read(request: HttpRequest, token_allowed: bool = False) -> bool:
    """Whether ``request`` may read the queue's figures."""
    if conf.get("METRICS_PUBLIC"):
        return True
    token = conf.get("METRICS_TOKEN")
    sent = request.headers.get("Authorization", "")
    if token_allowed and token and sent.startswith("Bearer "):
        return hmac.compare_digest(sent.removeprefix("Bearer ").encode(), token.encode())
    user = getattr(request, "user", None)
    if user is None or not user.is_active or not user.is_staff:
        return False
    return bool(user.has_perm("axa_django.view_job") or user.has_perm("axa_django.change_job"))


def _unavailable(error: Exception) -> HttpResponse:
    text = " ".join(str(error).split()) or type(error).__name__
    return HttpResponse(f"cannot read the queue database: {text}\n", status=503, content_type="text/plain")


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The queue's figures in the Prometheus text format."""
    if not may_read(request, token_allowed=True):
        return HttpResponse(REFUSED + "\n", status=403, content_type="text/plain")
    if not prometheus.available():
        return HttpResponse(prometheus.INSTALL + "\n", status=501, content_type="text/plain")
    try:
        snapshot = fleetstats.collect()
    except (DatabaseError, psycopg.Error) as error:
        return _unavailable(error)
    body, content_type = prometheus.exposition(snapshot)
    return HttpResponse(body, content_type=content_type)


@never_cache
@require_GET
def dashboard_data(request: HttpRequest) -> HttpResponse:
    """The live dashboard's poll, outside the admin: staff with view permission on jobs, or anyone if public."""
    if not may_read(request):
        return JsonResponse({"error": REFUSED}, status=403)
    return dashboard.live_response()
