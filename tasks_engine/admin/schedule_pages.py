"""Schedules in the admin: their state (next fire, last run, paused) and pause/resume.

Rows are state only; the definition (task, cron, timezone) is read from code and settings, so
a schedule removed from both shows as removed. Pause and resume go through
`tasks_engine.schedules` and need the permission `tasks_engine.pause_schedule` beside the view
permission (staff without it get 403, nothing changes, and are shown no buttons); each asks
for a reason (the row's button and the schedule's page through its pause/ or resume/ URL, the
list actions through the same confirmation) and writes an admin log entry with it, shown on
the schedule's history page.

"Run now" (the row's button, the schedule page's link, `<id>/run_now/`) starts one run of the
schedule's task with its input at once, outside its cron slots and whether it is paused or not.
It needs its own permission, `tasks_engine.run_now_schedule`, goes through `tasks_engine.enqueue`,
and is logged on the schedule's history page and on the run's. Its form carries a one-time
token that becomes the run's idempotency key (`schedule:<name>:now:<token>`): a form submitted
twice (a double click, a reload) starts one run. Bad input (a stale token, a reason too long, a
run the engine refuses) is one line, and nothing is written.
"""

from __future__ import annotations

import re
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince
from pydantic import ValidationError

from .. import clock, engine, schedules
from ..db.alias import admin_read_alias
from ..exceptions import IdempotencyConflict, UnknownScheduleError, UnknownTaskError
from ..models import Schedule, WorkflowRun
from ..values.secrets import redact_text
from ..values.serialization import check_reason
from . import ReadOnlyAdmin, run_link, when
from .audit import record
from .operator_actions import reason_from, unknown_object

# Per request: which of the buttons column's buttons the user may use, read once per list.
_page = threading.local()

PAUSE_PERMISSION = "tasks_engine.pause_schedule"
RUN_NOW_PERMISSION = "tasks_engine.run_now_schedule"
TOKEN = re.compile(r"^[0-9a-f]{32}$")
# What enqueue raises for a run it refuses (as the firing service catches them): nothing written.
REFUSED = (UnknownTaskError, ValidationError, IdempotencyConflict, ValueError, TypeError)
ACTIONS = {"pause": ("Paused", schedules.pause), "resume": ("Resumed", schedules.resume)}


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "task",
        "cron_in_zone",
        "state",
        "next_fire",
        "last_slot",
        "last_run",
        "last_error_short",
        "buttons",
    )
    list_display_links = ("name",)
    search_fields = ("name",)
    ordering = ("name",)
    sortable_by = ("name",)
    actions = ("pause_selected", "resume_selected")
    # The schedule's page shows the slot that fires next, not the stored `next_fire_at` (after
    # downtime the first missed slot, which is not the one that fires).
    fields = (
        "name",
        "cron",
        "timezone",
        "paused",
        "paused_at",
        "next_fire",
        "last_slot_at",
        "last_fired_at",
        "last_run_id",
        "last_error",
        "created_at",
        "updated_at",
    )
    readonly_fields = ("next_fire",)

    def has_pause_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(PAUSE_PERMISSION) and self.has_view_permission(request, obj)

    def has_run_now_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(RUN_NOW_PERMISSION) and self.has_view_permission(request, obj)

    def get_list_display(self, request: HttpRequest) -> Any:
        """The buttons column only for users who may use one of its buttons (others got a
        403): Pause/Resume, Run now."""
        shown = super().get_list_display(request)
        _page.buttons = (self.has_pause_permission(request), self.has_run_now_permission(request))
        if any(_page.buttons):
            return shown
        return tuple(column for column in shown if column != "buttons")

    def get_urls(self) -> list[Any]:
        info = (self.model._meta.app_label, self.model._meta.model_name)
        return [
            path(
                f"<path:object_id>/{op}/",
                self.admin_site.admin_view(self.pause_view),
                {"op": op},
                name=f"{info[0]}_{info[1]}_{op}",
            )
            for op in ACTIONS
        ] + [
            path(
                "<path:object_id>/run_now/",
                self.admin_site.admin_view(self.run_now_view),
                name=f"{info[0]}_{info[1]}_run_now",
            ),
            *super().get_urls(),
        ]

    # -- columns ---------------------------------------------------------------------------

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        # The definitions are read once per page, not per cell: each row gets its own.
        cl = super().get_changelist_instance(request)
        specs = schedules.defined()
        cl.result_list = list(cl.result_list)
        for row in cl.result_list:
            row.schedule_spec = specs.get(row.name)
        return cl

    def _spec(self, row: Schedule) -> schedules.ScheduleSpec | None:
        spec: schedules.ScheduleSpec | None = getattr(row, "schedule_spec", None)
        if spec is None and not hasattr(row, "schedule_spec"):  # the schedule's own page
            spec = schedules.defined().get(row.name)
        return spec

    @admin.display(description="task")
    def task(self, row: Schedule) -> str:
        spec = self._spec(row)
        return spec.task if spec else mark_safe('<span class="te-muted">removed</span>')

    @admin.display(description="cron")
    def cron_in_zone(self, row: Schedule) -> str:
        spec = self._spec(row)
        if spec is None:
            return ""
        return format_html(
            '<span class="te-mono">{}</span> <span class="te-muted">{}</span>',
            spec.cron.expr,
            spec.cron.timezone,
        )

    @admin.display(description="state")
    def state(self, row: Schedule) -> str:
        status = "paused" if row.paused else "active"
        css = "canceled" if row.paused else "running"
        return format_html('<span class="te-badge te-{}">{}</span>', css, status)

    @admin.display(description="next fire")
    def next_fire(self, row: Schedule) -> str:
        """The slot the leader fires next (schedules.next_fire): after downtime the latest
        missed slot, fired as soon as the leader runs; none when paused or removed."""
        now = clock.now()
        slot = schedules.next_fire(self._spec(row), row, now)
        if slot is not None and slot <= now:
            return _exact(slot, "missed: fires when the leader next runs")
        return _exact(slot)

    @admin.display(description="last slot")
    def last_slot(self, row: Schedule) -> str:
        return _exact(row.last_slot_at)

    @admin.display(description="last run")
    def last_run(self, row: Schedule) -> str:
        return run_link(row.last_run_id) if row.last_run_id else "-"

    @admin.display(description="last error")
    def last_error_short(self, row: Schedule) -> str:
        return row.last_error[:120]

    @admin.display(description="")
    def buttons(self, row: Schedule) -> str:
        if self._spec(row) is None:
            return ""
        may_pause, may_run_now = getattr(_page, "buttons", (False, False))
        op = "resume" if row.paused else "pause"
        shown = []
        if may_pause:
            shown.append(
                format_html(
                    '<a class="button" href="{}">{}</a>',
                    reverse(f"admin:tasks_engine_schedule_{op}", args=[row.pk]),
                    op.capitalize(),
                )
            )
        if may_run_now:
            shown.append(
                format_html(
                    '<a class="button te-run-now" href="{}">Run now</a>',
                    reverse("admin:tasks_engine_schedule_run_now", args=[row.pk]),
                )
            )
        return mark_safe(" ".join(shown))  # each part built by format_html

    # -- views -----------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        wanted = request.POST.get("action", "") if request.method == "POST" else ""
        if wanted in ("pause_selected", "resume_selected") and not self.has_pause_permission(
            request
        ):
            raise PermissionDenied  # Django would drop the action and say "none selected"
        if request.method == "GET":
            # Defined schedules the leader has not seen yet get a row (on the primary, only if
            # the list's own database lacks one).
            schedules.ensure_rows(seen_on=admin_read_alias())
        return super().changelist_view(request, {"title": "Schedules", **(extra_context or {})})

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        row = self.get_object(request, unquote(object_id))
        extra = {**(extra_context or {})}
        if row is not None and row.name in schedules.defined():
            op = "resume" if row.paused else "pause"
            if self.has_pause_permission(request, row):
                extra["schedule_op"] = op
                extra["schedule_op_url"] = reverse(
                    f"admin:tasks_engine_schedule_{op}", args=[row.pk]
                )
            if self.has_run_now_permission(request, row):
                extra["run_now_url"] = reverse("admin:tasks_engine_schedule_run_now", args=[row.pk])
        return super().change_view(request, object_id, form_url, extra)

    def pause_view(self, request: HttpRequest, object_id: str, op: str) -> HttpResponse:
        """GET: a confirmation with a reason field. POST: pause (or resume) with that reason."""
        if not self.has_pause_permission(request):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))
        if row is None:
            return unknown_object(request, self.model._meta, object_id)
        back = reverse("admin:tasks_engine_schedule_changelist")
        if request.method == "POST":
            self._apply(request, op, [row], reason_from(request))
            return HttpResponseRedirect(back)
        return self._confirmation(
            request,
            op,
            [row],
            title=f"{op.capitalize()} schedule {row.name}",
            form_action=request.path,
            back_url=back,
        )

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation with a reason field and a one-time token. POST: start the run."""
        if not self.has_run_now_permission(request):
            raise PermissionDenied
        row = self.get_object(request, unquote(object_id))
        if row is None:
            return unknown_object(request, self.model._meta, object_id)
        back = reverse("admin:tasks_engine_schedule_changelist")
        spec = schedules.defined().get(row.name)
        if spec is None:
            messages.warning(request, f"{row.name} is no longer defined; nothing started.")
            return HttpResponseRedirect(back)
        if request.method == "POST":
            self._run_now(request, row, spec, str(request.POST.get("token", "")))
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Run schedule {row.name} now",
            "schedule": row,
            "spec": spec,
            "token": uuid.uuid4().hex,
            "form_action": request.path,
            "back_url": back,
        }
        return TemplateResponse(
            request, "admin/tasks_engine/schedule/run_now_confirmation.html", context
        )

    def _run_now(
        self, request: HttpRequest, row: Schedule, spec: schedules.ScheduleSpec, token: str
    ) -> None:
        reason = reason_from(request)
        if not TOKEN.match(token):
            messages.error(request, "This form is out of date (no form token); open it again.")
            return
        try:  # its admin log entries must be storable: check before anything is written
            check_reason(reason)
        except ValueError as exc:
            messages.error(request, f"The {exc}; nothing started.")
            return
        key = f"schedule:{row.name}:now:{token}"
        try:
            res = engine.enqueue(spec.task, spec.input, idempotency_key=key)
        except REFUSED as exc:
            text = redact_text(" ".join(f"{type(exc).__name__}: {exc}".split()))[:500]
            messages.error(request, f"{row.name} could not start a run ({text}); nothing started.")
            return
        link = reverse("admin:tasks_engine_workflowrun_change", args=[res.run_id])
        if res.deduplicated:
            messages.info(
                request,
                format_html(
                    'This form was already submitted: it started run <a href="{}">{}</a>.',
                    link,
                    res.run_id,
                ),
            )
            return
        record(request.user, [row], f"Ran now: run {res.run_id}", reason)
        started = WorkflowRun.objects.filter(pk=res.run_id)
        record(request.user, started, f"Started by Run now of schedule {row.name}", reason)
        messages.success(
            request,
            format_html(
                'Started run <a href="{}">{}</a> of schedule {}.', link, res.run_id, row.name
            ),
        )

    def _confirmation(
        self, request: HttpRequest, op: str, rows: list[Schedule], **page: Any
    ) -> HttpResponse:
        """The confirmation with a reason field, for one schedule (its pause/ or resume/ URL)
        or for the schedules selected in the list (`page` has no form_action: the form posts
        the action back to the list, with confirm=yes)."""
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "schedules": rows,
            "op": op,
            "single": "form_action" in page,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "action_name": f"{op}_selected",
            **page,
        }
        return TemplateResponse(
            request, "admin/tasks_engine/schedule/pause_confirmation.html", context
        )

    def _apply(self, request: HttpRequest, op: str, rows: list[Schedule], reason: str) -> None:
        try:  # its admin log entry must be storable: check before anything changes
            check_reason(reason)
        except ValueError as exc:
            messages.error(request, f"The {exc}; nothing changed.")
            return
        verb, act = ACTIONS[op]
        changed = []
        for row in rows:
            try:
                if act(row.name):
                    changed.append(row)
            except UnknownScheduleError:
                messages.warning(request, f"{row.name} is no longer defined; nothing changed.")
        record(request.user, changed, verb, reason)
        if changed:
            names = ", ".join(r.name for r in changed)
            messages.success(request, f"{verb} {names}.")
        else:
            messages.info(request, "Nothing changed.")

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._confirm_or_apply(request, "pause", queryset)

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self._confirm_or_apply(request, "resume", queryset)

    def _confirm_or_apply(
        self, request: HttpRequest, op: str, queryset: QuerySet
    ) -> HttpResponse | None:
        """A list action asks for a reason as a schedule's own page does: first the
        confirmation, then (confirm=yes) the change, logged with that reason."""
        rows = list(queryset.order_by("name"))
        if request.POST.get("confirm") != "yes":
            return self._confirmation(
                request,
                op,
                rows,
                title=f"{op.capitalize()} schedules",
                back_url=request.get_full_path(),
            )
        self._apply(request, op, rows, reason_from(request))
        return None


def _exact(value: datetime | None, note: str = "") -> str:
    """A slot as an exact UTC time, with how far away it is (or `note`)."""
    if value is None:
        return "-"
    now = clock.now()
    relative = note or (f"in {timesince(now, value, depth=1)}" if value > now else when(value))
    return format_html(
        '<span class="te-mono">{} UTC</span> <span class="te-muted">{}</span>',
        value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        relative,
    )
