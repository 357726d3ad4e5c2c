"""The admin: a read-only inspector of runs, steps, facts and the op ledger, plus cancel and retry.

Nothing here writes an engine row. Add, change and delete answer 403 for everyone, superusers
included; a run's change page (GET) is the read-only run page, and any POST to it is refused.
Cancel (`admin/cancel.py`) and retry (`admin/retry.py`) go through the engine API, with the views
they share in `admin/operator_actions.py`.
Lists stay fast on millions of rows: see `paging.py`, `stats.py`, `filters.py`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from .. import clock
from ..db import partitions
from ..db.alias import admin_read_alias
from ..db.sql import is_postgres
from ..models import Fact, OpLedger, StepAttempt, Worker, WorkflowRun
from ..states import RunStatus
from ..values.secrets import mask_secrets
from . import stats as admin_stats
from .cancel_actions import CANCEL, CancelMixin
from .fact_actions import DeliverFactMixin, waits_on_fact
from .filters import QueueFilter, TaskFilter, VersionFilter, search_runs, short_run_id
from .lookups import RefuseMalformedSelectionMixin, RefuseNulLookupsMixin
from .matching import MatchingMixin
from .operator_actions import unknown_object
from .paging import CappedPaginator, RunPaginator, period_ranges
from .queue_pages import QueuesMixin
from .retry_actions import RETRY, RetryMixin, retry_refused, step_choices
from .run_page import elapsed, humanize_seconds, pass_timing, run_page

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
LONG_TASK_NAME = 24  # characters: a longer task name may break anywhere in the runs list


def status_badge(status: str, extra: str = "") -> str:
    return format_html('<span class="te-badge te-{}">{}</span>{}', status, status, extra)


def run_link(run_id: Any) -> str:
    if run_id is None:
        return "-"
    url = reverse("admin:tasks_engine_workflowrun_change", args=[run_id])
    return format_html('<a href="{}" class="te-mono">{}</a>', url, short_run_id(run_id))


def when(value: Any) -> str:
    """A relative time ("3 minutes ago") with the exact local time as its tooltip."""
    if value is None:
        return ""
    now = clock.now()
    recent = (now - value).total_seconds() < 60
    ago = "just now" if recent else f"{timesince(value, now, depth=1)} ago"
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z"),
        ago,
    )


class ReadOnlyAdmin(RefuseMalformedSelectionMixin, RefuseNulLookupsMixin, admin.ModelAdmin):
    """No add, change or delete for anyone; lists without full-table counts or facets; a NUL
    character in a list's filter parameters is an invalid lookup, and a list action with a
    malformed selected id a message, nothing changed (lookups.py)."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedPaginator
    list_per_page = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """Lists and pages read from TASKS_ENGINE["ADMIN_READ_DATABASE"] (a replica, or the
        engine's alias); the operator's actions write through the engine, on the primary."""
        return super().get_queryset(request).using(admin_read_alias())

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if request.method not in SAFE_METHODS:
            raise PermissionDenied
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(
    MatchingMixin, CancelMixin, RetryMixin, DeliverFactMixin, QueuesMixin, ReadOnlyAdmin
):
    list_display = (
        "short_id",
        "task",
        "status_badge",
        "queue",
        "priority",
        "attempts",
        "waits_on",
        "created",
        "duration",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        TaskFilter,
        VersionFilter,
        QueueFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("id",)  # shows the search box; get_search_results does the matching
    search_help_text = (
        "Exact run id (or its last 8 characters, as listed, or its first ones), task name"
        " (or task@version), idempotency key or trace id;"
        " tag:KEY=VALUE (several: every pair must match)."
    )
    ordering = ("-created_at",)
    sortable_by = ("created",)
    actions = ("cancel_selected", "retry_selected")

    def get_urls(self) -> list[Any]:
        return (
            self.cancel_urls()
            + self.retry_urls()
            + self.deliver_fact_urls()
            + self.matching_urls()
            + self.queues_urls()
            + super().get_urls()
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        try:
            return search_runs(queryset, search_term, postgres=is_postgres()), False
        except ValueError as exc:  # a tag:K=V the tag rule refuses
            messages.error(request, str(exc))
            return queryset.none(), False

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        if queryset.model is not WorkflowRun:  # the history view pages log entries
            return super().get_paginator(
                request, queryset, per_page, orphans, allow_empty_first_page
            )
        status = request.GET.get("status__exact")
        return RunPaginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            statuses=[status] if status else None,
            merge=not request.GET.get(TaskFilter.parameter_name),
            periods=period_ranges(queryset.db),
        )

    def get_ordering(self, request: HttpRequest) -> Any:
        # Partitioned: by id, which the period partitions are ranges of (paging.py).
        return ("-id",) if partitions.unit() is not None else self.ordering

    # -- columns ---------------------------------------------------------------------------

    @admin.display(description="run")
    def short_id(self, run: WorkflowRun) -> str:
        return format_html(
            '<span class="te-mono" title="{}">{}</span>', run.pk, short_run_id(run.pk)
        )

    @admin.display(description="task")
    def task(self, run: WorkflowRun) -> str:
        child = mark_safe('<span class="te-muted" title="child run">↳ </span>')
        # A name wraps before its @version; one too long for a column, anywhere (the list must
        # fit 1280 px: change_list.html).
        long = len(run.task_name) > LONG_TASK_NAME
        return format_html(
            '{}<span class="{}">{}</span><wbr><span class="te-muted">@{}</span>',
            child if run.parent_run_id else "",
            "te-break" if long else "",
            run.task_name,
            run.version,
        )

    @admin.display(description="status")
    def status_badge(self, run: WorkflowRun) -> str:
        extra = ""
        if run.status == RunStatus.RUNNING and run.cancel_requested_at:
            extra = format_html(' <span class="te-note">cancel requested</span>')
        elif run.status == RunStatus.RUNNING and isinstance(run.progress, dict):
            total, done = run.progress.get("total"), run.progress.get("done")
            if isinstance(total, int | float) and isinstance(done, int | float) and total > 0:
                extra = format_html(
                    ' <span class="te-minibar" title="{} / {}"><span style="width:{}%">'
                    "</span></span>",
                    done,
                    total,
                    round(min(done / total, 1) * 100),
                )
        return status_badge(run.status, extra)

    @admin.display(description="waits on", empty_value="")
    def waits_on(self, run: WorkflowRun) -> str:
        if run.status == RunStatus.WAITING:
            wake = ""
            if run.available_at:
                wake = format_html(
                    '<br><span class="te-muted" title="{}">wakes in {}</span>',
                    timezone.localtime(run.available_at).strftime("%Y-%m-%d %H:%M:%S %Z"),
                    timesince(clock.now(), run.available_at, depth=1),
                )
            return format_html('<span class="te-mono">{}</span>{}', run.waiting_on or "-", wake)
        if run.status == RunStatus.PENDING and run.available_at and run.available_at > clock.now():
            return format_html(
                '<span class="te-muted">due in {}</span>', timesince(clock.now(), run.available_at)
            )
        return ""

    @admin.display(description="created", ordering="created_at")
    def created(self, run: WorkflowRun) -> str:
        return when(run.created_at)

    @admin.display(description="duration")
    def duration(self, run: WorkflowRun) -> str:
        return pass_timing(run, clock.now()).duration

    # -- views -----------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self.refuse_unpermitted_actions(request, [CANCEL, RETRY])
        counts = admin_stats.status_counts()
        current = request.GET.get("status__exact", "")
        extra = {
            "title": "Workflow runs",
            "status_counts": counts,
            "status_bars": admin_stats.status_bars(counts),
            "throughput": admin_stats.throughput(),
            "current_status": current,
            "can_cancel_matching": self.may(request, CANCEL),
            "can_retry_matching": self.may(request, RETRY),
            "due_unserved": due_unserved(),
            **fleet_summary(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        """The read-only run page."""
        if request.method not in SAFE_METHODS:
            raise PermissionDenied
        run = (
            WorkflowRun.objects.using(admin_read_alias())
            .select_related("parent_run")
            .filter(pk=self._pk_or_none(unquote(object_id)))
            .first()
        )
        if run is None:
            return unknown_object(request, self.opts, object_id)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        warn_if_unserved(request, run)
        refused = retry_refused(run)
        context = {
            **self.admin_site.each_context(request),
            **run_page(run),
            "title": f"{run.task_name}@{run.version}",
            "opts": self.opts,
            "original": run,
            "change": True,
            "has_view_permission": True,
            "can_cancel": run.status in {"pending", "running", "waiting"}
            and run.cancel_requested_at is None
            and self.has_cancel_permission(request, run),
            "cancel_url": reverse("admin:tasks_engine_workflowrun_cancel", args=[run.pk]),
            "can_retry": run.status in {"failed", "canceled"}
            and refused is None
            and self.has_retry_permission(request, run),
            "retry_refused": refused,
            "retry_url": reverse("admin:tasks_engine_workflowrun_retry", args=[run.pk]),
            "retry_steps": step_choices(run.pk) if run.status in {"failed", "canceled"} else [],
            "waits_on_fact": waits_on_fact(run),
            "can_deliver_fact": waits_on_fact(run) is not None
            and self.has_deliver_fact_permission(request, run),
            "deliver_fact_url": reverse(
                "admin:tasks_engine_workflowrun_deliver_fact", args=[run.pk]
            ),
            "history_url": reverse("admin:tasks_engine_workflowrun_history", args=[run.pk]),
            "object_tools_in_content": django.VERSION < (6, 1),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/tasks_engine/workflowrun/change_form.html", context)

    def _pk_or_none(self, object_id: str) -> Any:
        try:
            return WorkflowRun._meta.pk.to_python(object_id)
        except ValidationError:
            return None


class MaskedFieldsMixin:
    """A row's read-only page shows the fields named in `masked_fields` (data a workflow stored)
    through `<field>_masked` display methods, with secrets masked (`values/secrets.py`); each
    admin declares those methods and lists them in `readonly_fields`."""

    masked_fields: tuple[str, ...] = ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fields = super().get_fields(request, obj)  # type: ignore[misc]
        shown = [f"{f}_masked" if f in self.masked_fields else f for f in fields]
        return list(dict.fromkeys(shown))  # the readonly `_masked` names, once, in place


def masked(value: Any) -> str | None:
    return None if value is None else json.dumps(mask_secrets(value), ensure_ascii=False)


class RunRowsAdmin(ReadOnlyAdmin):
    """Rows that belong to a run (step attempts, facts): newest first, found by run id."""

    search_fields = ("run__id",)
    search_help_text = "Exact run id."
    ordering = ("-id",)
    sortable_by = ("id",)

    def get_search_results(self, request, queryset, search_term):  # type: ignore[no-untyped-def]
        return _by_run_id(queryset, search_term), False

    @admin.display(description="run")
    def run_short(self, row: StepAttempt | Fact) -> str:
        return run_link(row.run_id)


@admin.register(StepAttempt)
class StepAttemptAdmin(MaskedFieldsMixin, RunRowsAdmin):
    list_display = ("id", "run_short", "name", "kind", "attempt", "status_badge", "started", "took")
    list_filter = ("status", "kind")
    masked_fields = ("output", "error")
    readonly_fields = ("output_masked", "error_masked")

    @admin.display(description="output")
    def output_masked(self, step: StepAttempt) -> str | None:
        return masked(step.output)

    @admin.display(description="error")
    def error_masked(self, step: StepAttempt) -> str | None:
        return masked(step.error)

    @admin.display(description="status")
    def status_badge(self, step: StepAttempt) -> str:
        return status_badge(step.status)

    @admin.display(description="started")
    def started(self, step: StepAttempt) -> str:
        return when(step.started_at)

    @admin.display(description="took")
    def took(self, step: StepAttempt) -> str:
        return humanize_seconds(elapsed(step.started_at, step.finished_at, clock.now()))


@admin.register(Fact)
class FactAdmin(MaskedFieldsMixin, RunRowsAdmin):
    list_display = ("id", "run_short", "name", "consumed_by", "created")
    masked_fields = ("payload",)
    readonly_fields = ("payload_masked",)

    @admin.display(description="payload")
    def payload_masked(self, fact: Fact) -> str | None:
        return masked(fact.payload)

    @admin.display(description="created")
    def created(self, fact: Fact) -> str:
        return when(fact.created_at)


@admin.register(OpLedger)
class OpLedgerAdmin(MaskedFieldsMixin, ReadOnlyAdmin):
    list_display = ("op_key", "run_short", "step_name", "status_badge", "created", "updated")
    list_filter = ("status",)
    masked_fields = ("result",)
    readonly_fields = ("result_masked",)
    search_fields = ("op_key",)
    search_help_text = "Exact op key or run id."
    ordering = ("-id",)
    sortable_by = ()

    @admin.display(description="result")
    def result_masked(self, op: OpLedger) -> str | None:
        return masked(op.result)

    def get_search_results(self, request, queryset, search_term):  # type: ignore[no-untyped-def]
        term = search_term.strip()
        if not term:
            return queryset, False
        return _by_run_id(queryset, term) | queryset.filter(op_key=term), False

    @admin.display(description="run")
    def run_short(self, op: OpLedger) -> str:
        return run_link(op.run_id)

    @admin.display(description="status")
    def status_badge(self, op: OpLedger) -> str:
        return status_badge(op.status)

    @admin.display(description="created")
    def created(self, op: OpLedger) -> str:
        return when(op.created_at)

    @admin.display(description="updated")
    def updated(self, op: OpLedger) -> str:
        return when(op.updated_at)


def _by_run_id(queryset: QuerySet, term: str) -> QuerySet:
    term = term.strip()
    if not term:
        return queryset
    try:
        return queryset.filter(run_id=uuid.UUID(term))
    except ValueError:
        return queryset.none()


from . import schedule_pages as _schedules  # noqa: E402, F401 - registers ScheduleAdmin (uses the above)

# Last: the workers page builds on ReadOnlyAdmin and `when` above.
from .worker_pages import WorkerAdmin, due_unserved, fleet_summary, warn_if_unserved  # noqa: E402

admin.site.register(Worker, WorkerAdmin)
