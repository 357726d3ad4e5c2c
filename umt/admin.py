"""Admin for UMT's tables. Adding a plan publishes its outbox event in the admin's transaction,
so the relay starts its `acquire` run; everything the workflow writes is read-only here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from tasks_engine.admin.lookups import RefuseNulLookupsMixin
from tasks_engine.models import WorkflowRun
from tasks_engine.values.secrets import redact_text

from .acquisition import announce, retry_plan
from .models import AcquisitionPlan, ClientLogin, LibraryItem


def run_link(run_id: Any) -> str:
    if run_id is None:
        return "-"
    url = reverse("admin:tasks_engine_workflowrun_change", args=[run_id])
    return format_html('<a href="{}">{}</a>', url, run_id)


@admin.register(AcquisitionPlan)
class AcquisitionPlanAdmin(RefuseNulLookupsMixin, admin.ModelAdmin):
    list_display = ["id", "title", "client", "status", "run", "created_at"]
    list_filter = ["status", "client"]
    actions = ["retry_failed_plans"]
    search_fields = ["title", "info_hash", "=run_id"]
    fields = [
        "title",
        "client",
        "source",
        "retention_seconds",
        "files",
        "status",
        "failure",
        "retries",
        "info_hash",
        "download_ref",
        "download_dir",
        "run",
        "release_runs",
        "created_at",
        "updated_at",
    ]
    readonly_fields = [
        "source_shown",
        "status",
        "failure_shown",
        "retries",
        "info_hash",
        "download_ref_shown",
        "download_dir",
        "run",
        "release_runs",
        "created_at",
        "updated_at",
    ]
    # On a plan's page, these hold URLs (a magnet's tracker may carry a passkey): shown masked,
    # the failure too (stored redacted, but by the rules of the day it was written).
    shown_masked = {
        "source": "source_shown",
        "download_ref": "download_ref_shown",
        "failure": "failure_shown",
    }

    @admin.display(description="source")
    def source_shown(self, obj: AcquisitionPlan) -> str:
        return redact_text(obj.source)

    @admin.display(description="download ref")
    def download_ref_shown(self, obj: AcquisitionPlan) -> str:
        return redact_text(obj.download_ref)

    @admin.display(description="failure")
    def failure_shown(self, obj: AcquisitionPlan) -> str:
        return redact_text(obj.failure)

    @admin.display(description="workflow runs")
    def run(self, obj: AcquisitionPlan) -> str:
        """The plan's run, with its status (a retried plan's runs share its idempotency key)."""
        if obj.run_id is None:
            return "-"
        row = WorkflowRun.objects.filter(pk=obj.run_id).values_list("status", flat=True).first()
        return format_html("{} ({})", run_link(obj.run_id), row or "pruned")

    @admin.display(description="cleanup retried by")
    def release_runs(self, obj: AcquisitionPlan) -> str:
        """The `release-download` runs that took over a cleanup the plan's run could not do."""
        runs = WorkflowRun.objects.filter(
            task_name="release-download", idempotency_key__startswith=f"release:{obj.pk}:"
        ).values_list("pk", "status")
        if not runs:
            return "-"
        return format_html_join(", ", "{} ({})", ((run_link(pk), status) for pk, status in runs))

    @admin.action(description="Retry the selected failed plans", permissions=["retry"])
    def retry_failed_plans(self, request: HttpRequest, queryset: QuerySet[AcquisitionPlan]) -> None:
        """Each failed plan's run gets a fresh pass from `submit-download` (umt.acquisition.
        retry_plan); plans that are not failed are left as they are."""
        who = request.user.get_username()
        retried = [p.pk for p in queryset if retry_plan(p.pk, reason="admin action", by=who)]
        skipped = queryset.count() - len(retried)
        self.message_user(request, f"Retried {len(retried)} plan(s); {skipped} not failed.")
        if skipped:
            self.message_user(request, "Only failed plans can be retried.", messages.WARNING)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("tasks_engine.retry_workflowrun")  # as the run's Retry

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding: only what a person decides
            return ["title", "client", "source", "retention_seconds", "files"]
        return [self.shown_masked.get(str(name), name) for name in self.fields]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the workflow owns a plan once it exists: its page is view-only

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a plan is the business record of its run and library item

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if not change:
            announce(obj)  # same transaction as the row (the admin's change view is atomic)


@admin.register(LibraryItem)
class LibraryItemAdmin(RefuseNulLookupsMixin, admin.ModelAdmin):
    list_display = ["title", "path", "size", "registered_at", "created_at"]
    search_fields = ["title", "path", "content_hash"]
    readonly_fields = [
        "plan",
        "title",
        "path",
        "size",
        "hash_algorithm",
        "content_hash",
        "registered_at",
        "created_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the row is the library's record of a file on disk


@admin.register(ClientLogin)
class ClientLoginAdmin(RefuseNulLookupsMixin, admin.ModelAdmin):
    """UMT's failed logins at a download client. Deleting a row lets UMT try to log in again
    at once (after the operator fixed the password on the client's side, say)."""

    list_display = ["client_url", "failures", "next_attempt_at", "last_error", "updated_at"]
    readonly_fields = ["client_url", "failures", "next_attempt_at", "last_error", "updated_at"]
    exclude = ["credentials"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
