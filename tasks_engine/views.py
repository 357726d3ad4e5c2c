"""Web views of the engine: Prometheus metrics for a web process (no worker registry here)."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .conf import engine_settings
from .observe import metrics as engine_metrics


@require_safe  # GET, and HEAD: the same answer, its body left out by the server
def metrics(request: HttpRequest) -> HttpResponse:
    """The database gauges (`tasks_runs{queue,status}`), computed now, as Prometheus text.

    Open, as scrape targets usually are (a scraper has no session), unless
    `TASKS_ENGINE["METRICS_TOKEN"]` is set: then only `Authorization: Bearer <token>` gets them
    (Prometheus: `authorization: {credentials: ...}` in the scrape config). It shows counts per
    queue and status, nothing about a run's content."""
    token = engine_settings().metrics_token
    if token:
        # RFC 7235: a case-insensitive scheme, then one or more spaces, then the token.
        scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
        matches = hmac.compare_digest(sent.lstrip(" ").encode(), str(token).encode())
        if scheme.lower() != "bearer" or not matches:
            refused = HttpResponse(
                "metrics need a bearer token\n", status=401, content_type="text/plain"
            )
            refused["WWW-Authenticate"] = "Bearer"  # RFC 7235: the scheme a retry should use
            return refused
    body = generate_latest(engine_metrics.database_registry())
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
