"""The queues page (`admin/tasks_engine/workflowrun/queues/`): every known queue (in QUEUES,
named by a workflow, with active runs or a row) with its state (paused, and why), its limits in
effect (QUEUES with the operator's overrides), its running, pending and waiting runs and the
age of its oldest pending run; and the busiest concurrency keys.

The page reads TASKS_ENGINE["ADMIN_READ_DATABASE"] (a replica, or the engine's alias), as the
runs list does. Operators act on a queue through operations/queues.py, on the primary: pause
and resume (`queues/<name>/pause/` and `.../resume/`, a confirmation with a reason) behind
`tasks_engine.pause_queue`, and its `concurrency` and `rate_limit` overrides
(`queues/<name>/limits/`) behind `tasks_engine.change_queue`; staff without the permission
get 403 and nothing changes. Each change is written to the admin log, on the queue's row. The
limits form starts from the primary's values: an edit must not start from a lagging copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, Min
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from .. import clock
from ..conf import QueueLimits, engine_settings, parse_rate
from ..db.alias import admin_read_alias
from ..models import Queue, WorkflowRun
from ..operations import queues
from ..values.serialization import REASON_MAX_LENGTH, check_reason
from .audit import record
from .operator_actions import reason_from
from .run_page import humanize_seconds

PAUSE_PERMISSION = "tasks_engine.pause_queue"
CHANGE_PERMISSION = "tasks_engine.change_queue"

ACTIVE = ("pending", "running", "waiting")
BUSIEST_KEYS = 20
WINDOWS = {1.0: "second", 60.0: "minute", 3600.0: "hour"}


@dataclass
class Row:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    limit: str = ""
    oldest_pending: str = ""
    paused: bool = False
    reason: str = ""
    overridden: tuple[str, ...] = ()

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
    db = admin_read_alias()
    views = queues.list_queues(using=db)
    limits = effective_limits(views)
    rows: dict[str, Row] = {}
    for v in views:
        rows[v.name] = Row(
            v.name,
            counts={"pending": v.pending, "running": v.running, "waiting": v.waiting},
            paused=v.paused,
            reason=v.reason,
            overridden=v.overridden,
        )
    # How long the longest-waiting due run has waited since it was due: a run deferred to later
    # (available_at ahead) is not waiting yet, and a long wait says the queue is stuck or full.
    pending = WorkflowRun.objects.using(db).filter(status="pending", available_at__lte=now)
    for queue, oldest in (
        pending.values_list("queue").annotate(oldest=Min("available_at")).order_by()
    ):
        rows[queue].oldest_pending = humanize_seconds((now - oldest).total_seconds())
    for name, lim in limits.items():
        if name not in rows:
            continue
        parts = [f"{lim.concurrency} at once"] if lim.concurrency else []
        if lim.rate:
            n, window = lim.rate
            parts.append(f"{n} per {WINDOWS.get(window, humanize_seconds(window))}")
        if lim.worker_concurrency:
            parts.append(f"{lim.worker_concurrency} per worker")
        rows[name].limit = ", ".join(parts)
    return sorted(rows.values(), key=lambda r: r.name)


def effective_limits(views: list[queues.QueueView]) -> dict[str, QueueLimits]:
    """Each queue's limits in effect, as the workers apply them: QUEUES with the overrides the
    views read (from the page's database, not this process's snapshot of the primary)."""
    settings = engine_settings().queues
    out = {}
    for v in views:
        base = settings.get(v.name, QueueLimits())
        rate = base.rate
        if "rate_limit" in v.overridden and v.rate_limit:
            rate = parse_rate(v.rate_limit, "rate limit")
        out[v.name] = QueueLimits(v.concurrency, rate, base.worker_concurrency)
    return out


def busiest_keys() -> list[Row]:
    keyed = WorkflowRun.objects.using(admin_read_alias()).filter(
        status__in=ACTIVE, concurrency_key__isnull=False
    )
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
        urls = [path("queues/", view, name="{}_{}_queues".format(*info))]
        for op in ("pause", "resume", "limits"):
            urls.append(
                path(
                    f"queues/<path:name>/{op}/",
                    self.admin_site.admin_view(self.queue_op_view),
                    {"op": op},
                    name="{}_{}_queue_{}".format(*info, op),
                )
            )
        return urls

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Queues",
            "queues": queue_rows(clock.now()),
            "keys": busiest_keys(),
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "can_change": request.user.has_perm(CHANGE_PERMISSION),
        }
        return TemplateResponse(request, "admin/tasks_engine/workflowrun/queues.html", context)

    def queue_op_view(self, request: HttpRequest, name: str, op: str) -> HttpResponse:
        """GET: the confirmation (pause, resume) or the limits form. POST: the change, through
        `tasks_engine.operations.queues`, logged with the reason; a bad value changes nothing."""
        wanted = CHANGE_PERMISSION if op == "limits" else PAUSE_PERMISSION
        if not self.has_view_permission(request) or not request.user.has_perm(wanted):  # type: ignore[attr-defined]
            raise PermissionDenied
        try:
            queues.check_queue_name(name)
        except (TypeError, ValueError) as exc:
            messages.error(request, f"{exc}; nothing changed.")
            return HttpResponseRedirect(reverse("admin:tasks_engine_workflowrun_queues"))
        form = LimitsForm(request.POST or None, initial=_current_limits(name))
        if request.method == "POST":
            if op == "limits" and form.is_valid():
                return self._apply(request, name, op, form.cleaned_data)
            if op != "limits":
                return self._apply(request, name, op, {"reason": reason_from(request)})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"{'Limits of' if op == 'limits' else op.capitalize()} queue {name}",
            "queue": name,
            "op": op,
            "form": form,
            "reason_max": REASON_MAX_LENGTH,
            "back_url": reverse("admin:tasks_engine_workflowrun_queues"),
        }
        return TemplateResponse(
            request, "admin/tasks_engine/workflowrun/queue_action.html", context
        )

    def _apply(self, request: HttpRequest, name: str, op: str, data: dict[str, Any]) -> Any:
        back = HttpResponseRedirect(reverse("admin:tasks_engine_workflowrun_queues"))
        reason = data.get("reason") or ""
        try:
            check_reason(reason)  # its admin log entry must be storable: checked first
            if op == "pause":
                changed = queues.pause_queue(name, reason=reason or None)
                verb = "Paused"
            elif op == "resume":
                changed = queues.resume_queue(name)
                verb = "Resumed"
            else:
                concurrency, rate = queues.set_queue_limits(
                    name, concurrency=data["concurrency"], rate_limit=data["rate_limit"] or None
                )
                changed = True
                verb = (
                    f"Limits set: concurrency {concurrency or 'from settings'},"
                    f" rate limit {rate or 'from settings'}"
                )
        except (TypeError, ValueError) as exc:
            messages.error(request, f"{exc}; nothing changed.")
            return back
        if not changed:
            messages.info(
                request,
                f"Nothing changed: {name} was {'already' if op == 'pause' else 'not'} paused.",
            )
            return back
        record(request.user, Queue.objects.filter(name=name), verb, reason)
        messages.success(request, f"{verb.split(':')[0]} {name}.")
        return back


def _current_limits(name: str) -> dict[str, Any]:
    row = Queue.objects.filter(name=name).first()
    if row is None:
        return {}
    return {"concurrency": row.concurrency, "rate_limit": row.rate_limit}


class LimitsForm(forms.Form):
    """A queue's overrides; blank: the setting's value (TASKS_ENGINE["QUEUES"])."""

    concurrency = forms.IntegerField(
        required=False, min_value=1, max_value=2**31 - 1, help_text="blank: from the settings"
    )
    rate_limit = forms.CharField(
        required=False, max_length=32, help_text="N/s, N/m or N/h; blank: from the settings"
    )
    reason = forms.CharField(required=False, max_length=REASON_MAX_LENGTH, widget=forms.Textarea)

    def clean_rate_limit(self) -> str:
        value = (self.cleaned_data.get("rate_limit") or "").strip()
        if value:
            try:
                parse_rate(value, "rate limit")
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return value


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    """Queue rows are changed on the Queues page only; the list leads there, and each row's
    history page shows its admin log (pauses, resumes, limits)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:tasks_engine_workflowrun_queues"))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            raise PermissionDenied
        return super().change_view(request, object_id, form_url, extra_context)
