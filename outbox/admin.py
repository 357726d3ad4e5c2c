"""Read-only admin for outbox events; its one action, `retry_selected`, calls `retry_dead`."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from tasks_engine.admin.audit import record
from tasks_engine.admin.lookups import RefuseMalformedSelectionMixin, RefuseNulLookupsMixin
from tasks_engine.values.secrets import mask_secrets

from .events import revive_dead
from .models import OutboxEvent

RETRY_PERMISSION = "outbox.retry_outboxevent"


@admin.register(OutboxEvent)
class OutboxEventAdmin(RefuseMalformedSelectionMixin, RefuseNulLookupsMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "type",
        "status",
        "attempts",
        "max_attempts",
        "next_attempt_at",
        "created_at",
        "published_at",
        "error_summary",
    )
    list_filter = ("status", "type")
    search_fields = ("=idempotency_key", "=id")
    ordering = ("-id",)
    actions = ["retry_selected"]
    fields = (
        "id",
        "type",
        "status",
        "idempotency_key",
        "attempts",
        "max_attempts",
        "next_attempt_at",
        "created_at",
        "published_at",
        "payload_pretty",
        "last_error_pre",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RETRY_PERMISSION)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django would just drop an action the user may not run ("No action selected."):
        # answer 403 instead, so a refused retry is not mistaken for a done one.
        if (
            request.method == "POST"
            and request.POST.get("action") == "retry_selected"
            and not self.has_retry_permission(request)
        ):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    @admin.action(description="Retry selected dead events", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[OutboxEvent]) -> None:
        selected = list(queryset.values_list("pk", flat=True))
        revived_ids = revive_dead(selected)
        record(
            request.user,
            OutboxEvent.objects.filter(pk__in=revived_ids),
            "Retried",
            "dead event put back to pending with a fresh attempt budget",
        )
        revived = len(revived_ids)
        skipped = len(selected) - revived
        level = messages.SUCCESS if revived else messages.WARNING
        text = f"{revived} dead event(s) put back to pending"
        if skipped:
            text += f"; {skipped} not dead, left alone"
        self.message_user(request, text, level)

    @admin.display(description="payload")
    def payload_pretty(self, obj: OutboxEvent) -> str:
        shown = mask_secrets(obj.payload)
        return format_html("<pre>{}</pre>", json.dumps(shown, indent=2, sort_keys=True))

    @admin.display(description="last error")
    def last_error_pre(self, obj: OutboxEvent) -> str:
        return format_html("<pre>{}</pre>", mask_secrets(obj.last_error)) if obj.last_error else "-"

    @admin.display(description="error")
    def error_summary(self, obj: OutboxEvent) -> str:
        return mask_secrets(obj.last_error.partition("\n")[0])[:120]
