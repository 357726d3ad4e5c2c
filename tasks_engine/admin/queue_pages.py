"""The queues page (`admin/tasks_engine/workflowrun/queues/`): each queue's limits from
TASKS_ENGINE["QUEUES"], its running, pending and waiting runs and the age of its oldest pending
run, and the busiest concurrency keys. Read-only, like the rest of the admin."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Min
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from .. import clock
from ..conf import engine_settings
from ..models import WorkflowRun
from .run_page import humanize_seconds

ACTIVE = ("pending", "running", "waiting")
BUSIEST_KEYS = 20
WINDOWS = {1.0: "second", 60.0: "minute", 3600.0: "hour"}


@dataclass
class Row:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    limit: str = ""
    oldest_pending: str = ""

    @property
    def running(self) -> int:
        return self.counts.get("running", 0)

    @property
    def pending(self) -> int:
        return self.counts.get("pending", 0)

    @property
    def waiting(self) -> int:
        return self.counts.get("waiting", 0)


def queue_rows(now: datetime) -> list[Row]:
    limits = engine_settings().queues
    rows: dict[str, Row] = {q: Row(q) for q in limits}
    active = WorkflowRun.objects.filter(status__in=ACTIVE)
    for r in active.values("queue", "status").annotate(n=Count("id")).order_by():
        rows.setdefault(r["queue"], Row(r["queue"])).counts[r["status"]] = r["n"]
    # How long the longest-waiting due run has waited since it was due: a run deferred to later
    # (available_at ahead) is not waiting yet, and a long wait says the queue is stuck or full.
    pending = WorkflowRun.objects.filter(status="pending", available_at__lte=now)
    for queue, oldest in (
        pending.values_list("queue").annotate(oldest=Min("available_at")).order_by()
    ):
        rows[queue].oldest_pending = humanize_seconds((now - oldest).total_seconds())
    for name, lim in limits.items():
        parts = [f"{lim.concurrency} at once"] if lim.concurrency else []
        if lim.rate:
            n, window = lim.rate
            parts.append(f"{n} per {WINDOWS.get(window, humanize_seconds(window))}")
        if lim.worker_concurrency:
            parts.append(f"{lim.worker_concurrency} per worker")
        rows[name].limit = ", ".join(parts)
    return sorted(rows.values(), key=lambda r: r.name)


def busiest_keys() -> list[Row]:
    keyed = WorkflowRun.objects.filter(status__in=ACTIVE, concurrency_key__isnull=False)
    totals = (
        keyed.values("concurrency_key")
        .annotate(n=Count("id"), limit=Max("concurrency_limit"))
        .order_by("-n", "concurrency_key")[:BUSIEST_KEYS]
    )
    rows = {str(t["concurrency_key"]): Row(str(t["concurrency_key"])) for t in totals}
    for t in totals:
        rows[str(t["concurrency_key"])].limit = str(t["limit"] or 1)
    by_status = keyed.filter(concurrency_key__in=list(rows)).values("concurrency_key", "status")
    for r in by_status.annotate(n=Count("id")).order_by():
        rows[str(r["concurrency_key"])].counts[r["status"]] = r["n"]
    return list(rows.values())


class QueuesMixin:
    """Adds the queues page to the runs admin."""

    admin_site: Any
    model: Any

    def queues_urls(self) -> list[Any]:
        info = (self.model._meta.app_label, self.model._meta.model_name)
        view = self.admin_site.admin_view(self.queues_view)
        return [path("queues/", view, name="{}_{}_queues".format(*info))]

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Queues",
            "queues": queue_rows(clock.now()),
            "keys": busiest_keys(),
        }
        return TemplateResponse(request, "admin/tasks_engine/workflowrun/queues.html", context)
