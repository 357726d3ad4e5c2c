"""The workers page (read-only, like every engine page): each worker process with its last beat,
whether it is alive, whether it is the maintenance leader, and the runs it holds; and the
fleet summary the runs list shows above its table (live workers, the leader, and unfinished
runs that no live worker serves). All of it reads TASKS_ENGINE["ADMIN_READ_DATABASE"] (a
replica, or the engine's alias), as the runs list does."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..db.alias import admin_read_alias
from ..models import Worker, WorkflowRun
from ..services import health
from ..services.fleet import UNFINISHED, alive_since, live_filters, served, unserved_runs
from ..services.leader import current_leader
from . import ReadOnlyAdmin, when

# Per request: the leader and the liveness cutoff, read once for the whole list.
_page = threading.local()


def fleet_summary() -> dict[str, Any]:
    """What the runs list says about the workers: how many are alive, who leads, and the
    unfinished runs that no live worker serves (None: no worker alive, nothing known)."""
    db = admin_read_alias()
    leader = current_leader(using=db)
    live = live_filters(using=db)
    return {
        "workers_url": reverse("admin:tasks_engine_worker_changelist"),
        "workers_live": len(live),
        "leader_id": leader.worker_id if leader else None,
        "unserved": [
            {**u, "url": runs_url(**unserved_filters(u))}
            for u in unserved_runs(live, using=db) or []
        ],
    }


def due_unserved() -> list[str]:
    """The runs list's red banner: the lines of `manage.py tasks health` about runs that are
    due now (pending, available) and that no live worker serves, one per (task, version,
    queue); none when every due run has a worker. The same logic as the readiness probe, so
    the admin and the probe never disagree."""
    return health.unserved_due_runs(using=admin_read_alias())


def warn_if_unserved(request: HttpRequest, run: WorkflowRun) -> None:
    """On a run page: say so when no live worker serves this unfinished run."""
    db = admin_read_alias()
    if run.status in UNFINISHED and served(run.task_name, run.version, run.queue, db) is False:
        messages.warning(
            request,
            f"No live worker serves {run.task_name}@{run.version} in queue {run.queue}: "
            "this run will not move until one does.",
        )


def unserved_filters(u: dict[str, Any]) -> dict[str, Any]:
    """The runs list's own filters (the sidebar's parameters) for these unfinished runs."""
    return {
        "task": u["task"],
        "version": u["version"],
        "queue": u["queue"],
        "status__in": "pending,running,waiting",
    }


def runs_url(**filters: Any) -> str:
    return f"{reverse('admin:tasks_engine_workflowrun_changelist')}?{urlencode(filters)}"


class WorkerAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "state",
        "leader",
        "host",
        "pid",
        "held",
        "concurrency",
        "serves_queues",
        "serves_tasks",
        "beat",
        "started",
    )
    list_display_links = None
    ordering = ("started_at",)
    sortable_by = ()

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        running = (
            WorkflowRun.objects.filter(status="running", worker_id=OuterRef("pk"))
            .order_by()
            .values("worker_id")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(running=Subquery(running, output_field=IntegerField()))
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        db = admin_read_alias()
        leader = current_leader(using=db)
        _page.leader = leader.worker_id if leader else None
        _page.since = alive_since(using=db)
        extra = {"title": "Workers", "runs_url": runs_url(), **(extra_context or {})}
        return super().changelist_view(request, extra)

    @admin.display(description="state")
    def state(self, w: Worker) -> str:
        since = getattr(_page, "since", None) or alive_since(admin_read_alias())
        alive = w.last_heartbeat >= since
        return format_html(
            '<span class="te-badge te-{}">{}</span>',
            "completed" if alive else "failed",
            "alive" if alive else "dead",
        )

    @admin.display(description="leader")
    def leader(self, w: Worker) -> str:
        """A badge on the one leader; nothing on the others (being no leader is not a fault,
        so no red mark)."""
        if w.pk != getattr(_page, "leader", None):
            return ""
        return format_html(
            '<span class="te-badge te-running te-leader" title="{}">leader</span>',
            "runs the maintenance services (schedules, reaping, retention)",
        )

    @admin.display(description="runs held")
    def held(self, w: Worker) -> str:
        n = getattr(w, "running", None) or 0
        if not n:
            return "0"
        url = runs_url(worker_id=w.pk, status__exact="running")
        return format_html('<a href="{}">{}</a>', url, n)

    @admin.display(description="queues")
    def serves_queues(self, w: Worker) -> str:
        return ", ".join(w.queues) or "all"

    @admin.display(description="tasks")
    def serves_tasks(self, w: Worker) -> str:
        return format_html_join(", ", "<code>{}</code>", ((t,) for t in w.tasks))

    @admin.display(description="last beat")
    def beat(self, w: Worker) -> str:
        return when(w.last_heartbeat)

    @admin.display(description="started")
    def started(self, w: Worker) -> str:
        return when(w.started_at)
