"""Cancel from the admin: the run page's button and the `cancel_selected` list action.

Both need the permission `tasks_engine.cancel_workflowrun` and the view permission on runs
(a user who cannot see a run cannot cancel it: 403, nothing changes), and both go through
`tasks_engine.engine.cancel`, never the ORM: the engine records the reason, cancels idle runs
at once, asks the worker holding a running one to stop, and cancels children.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .. import engine
from ..exceptions import UnknownRunError
from ..states import ACTIVE

CANCEL_PERMISSION = "tasks_engine.cancel_workflowrun"
MAX_REASON = 2000
MAX_BULK_CANCEL = 1000  # runs per action submission; repeat the action for more


def reason_from(request: HttpRequest) -> str:
    return request.POST.get("reason", "").strip()[:MAX_REASON]


class CancelMixin:
    """Adds `<run id>/cancel/` and the `cancel_selected` action to the runs' ModelAdmin."""

    admin_site: admin.AdminSite
    model: Any

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Cancel acts on runs the user can see: without the view permission the run page, the
        # list and the confirmation page are not theirs, so neither is the cancel (403).
        if not request.user.has_perm(CANCEL_PERMISSION):
            return False
        return bool(self.has_view_permission(request, obj))  # type: ignore[attr-defined]

    def cancel_urls(self) -> list[Any]:
        info = (self.model._meta.app_label, self.model._meta.model_name)
        return [
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name="{}_{}_cancel".format(*info),
            )
        ]

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page with a reason field. POST: cancel with that reason."""
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        run = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if run is None:
            raise Http404("no such run")
        run_url = reverse("admin:tasks_engine_workflowrun_change", args=[run.pk])
        if request.method == "POST":
            self._cancel_one(request, run.pk, reason_from(request))
            return HttpResponseRedirect(run_url)
        context = {
            **self.admin_site.each_context(request),
            "title": "Cancel run",
            "opts": self.model._meta,
            "runs": [run],
            "single": True,
            "form_action": request.path,
            "back_url": run_url,
        }
        return TemplateResponse(
            request, "admin/tasks_engine/workflowrun/cancel_confirmation.html", context
        )

    def _cancel_one(self, request: HttpRequest, run_id: Any, reason: str) -> bool:
        try:
            canceled = engine.cancel(run_id, reason)
        except UnknownRunError:
            raise Http404("no such run") from None
        if canceled:
            messages.success(request, format_html("Cancel requested for run {}.", run_id))
        else:
            messages.warning(
                request, format_html("Run {} had already finished; nothing changed.", run_id)
            )
        return canceled

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        active = queryset.filter(status__in=list(ACTIVE)).order_by("-created_at")
        if request.POST.get("confirm") != "yes":
            runs = list(
                active.only("id", "task_name", "version", "status", "created_at")[:MAX_BULK_CANCEL]
            )
            context = {
                **self.admin_site.each_context(request),
                "title": "Cancel runs",
                "opts": self.model._meta,
                "runs": runs,
                "single": False,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "back_url": request.get_full_path(),
                "max_bulk": MAX_BULK_CANCEL,
            }
            return TemplateResponse(
                request, "admin/tasks_engine/workflowrun/cancel_confirmation.html", context
            )
        reason = reason_from(request)
        ids = list(active.values_list("pk", flat=True)[:MAX_BULK_CANCEL])
        done = sum(1 for run_id in ids if _cancel_quietly(run_id, reason))
        messages.success(request, f"Cancel requested for {done} run(s).")
        if len(ids) == MAX_BULK_CANCEL:
            messages.info(request, f"At most {MAX_BULK_CANCEL} runs per action; run it again.")
        return None

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # Django drops actions the user may not run and answers "no action selected"; say 403.
        wants_cancel = request.method == "POST" and request.POST.get("action") == "cancel_selected"
        if wants_cancel and not self.has_cancel_permission(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)  # type: ignore[misc]


def _cancel_quietly(run_id: Any, reason: str) -> bool:
    try:
        return engine.cancel(run_id, reason)
    except UnknownRunError:  # pruned between the page and the click
        return False
