"""Cancel from the admin: the run page's button and the `cancel_selected` list action.

Both need the permission `tasks_engine.cancel_workflowrun` and the view permission on runs, and
both go through `tasks_engine.engine.cancel`, never the ORM: the engine records the reason,
cancels idle runs at once, asks the worker holding a running one to stop, and cancels children.
The views they share with retry are in `operator_actions.py`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from .. import engine
from ..models import WorkflowRun
from ..states import ACTIVE, RunStatus
from .operator_actions import OperatorActionsMixin, RunAction

CANCEL_PERMISSION = "tasks_engine.cancel_workflowrun"


def _canceled_message(acted: list[Any]) -> str:
    """Runs that were pending or waiting are canceled at once; a running one is asked to stop
    and ends canceled at its worker's next heartbeat."""
    at_once = WorkflowRun.objects.filter(pk__in=acted, status=RunStatus.CANCELED).count()
    asked = len(acted) - at_once
    if not asked:
        return f"Canceled {at_once} run(s)."
    return (
        f"Canceled {at_once} run(s); cancel requested for {asked} running run(s): their"
        " workers stop them at their next heartbeat."
    )


CANCEL = RunAction(
    name="cancel",
    permission=CANCEL_PERMISSION,
    statuses=ACTIVE,
    title="Cancel run",
    template="admin/tasks_engine/workflowrun/cancel_confirmation.html",
    logged_as="Canceled",
    done="Canceled {n} run(s).",
    done_message=_canceled_message,
)


class CancelMixin(OperatorActionsMixin):
    """Adds `<run id>/cancel/` and the `cancel_selected` action to the runs' ModelAdmin."""

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.may(request, CANCEL, obj)

    def cancel_urls(self) -> list[Any]:
        return [self.action_url(CANCEL, self.cancel_view)]

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page with a reason field. POST: cancel with that reason."""

        def cancel_one(run: Any, reason: str) -> bool:
            canceled = self._cancel(request, run, reason)
            now = WorkflowRun.objects.filter(pk=run.pk).values_list("status", flat=True).first()
            if canceled and now == RunStatus.CANCELED:  # pending or waiting: canceled at once
                messages.success(request, format_html("Run {} canceled.", run.pk))
            elif canceled:  # running: its worker stops it at its next heartbeat
                messages.success(
                    request,
                    format_html(
                        "Cancel requested for run {}: its worker stops it at its next heartbeat.",
                        run.pk,
                    ),
                )
            else:
                messages.warning(
                    request, format_html("Run {} had already finished; nothing changed.", run.pk)
                )
            return canceled

        return self.confirm_or_act(request, object_id, CANCEL, cancel_one)

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.confirm_or_act_on_selected(
            request, queryset, CANCEL, lambda run, reason: self._cancel(request, run, reason)
        )

    def _cancel(self, request: HttpRequest, run: Any, reason: str) -> bool:
        canceled = engine.cancel(run.pk, reason)
        if canceled:
            self.log(request, run, CANCEL.logged_as, reason)
        return canceled
