"""Retry from the admin: the run page's Retry button and the `retry_selected` list action.

Both need the permission `tasks_engine.retry_workflowrun` and the view permission on runs, and
both go through `tasks_engine.engine.retry_run`. The run page's form offers the run's recorded
steps to start from (`from_step`); the list action retries each failed or canceled run from
where it failed. The views they share with cancel are in `operator_actions.py`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from .. import engine
from ..db.alias import admin_read_alias
from ..exceptions import UnknownStepError
from ..models import StepAttempt
from ..transitions.retry import RETRYABLE, why_not_retryable
from .operator_actions import OperatorActionsMixin, RunAction

RETRY_PERMISSION = "tasks_engine.retry_workflowrun"

RETRY = RunAction(
    name="retry",
    permission=RETRY_PERMISSION,
    statuses=frozenset(RETRYABLE),
    title="Retry run",
    template="admin/tasks_engine/workflowrun/retry_confirmation.html",
    logged_as="Retried",
    done="Retried {n} run(s).",
)


def step_choices(run_id: Any) -> list[str]:
    """The run's step keys (not superseded), in the order they were first recorded."""
    names = (
        StepAttempt.objects.using(admin_read_alias())
        .filter(run_id=run_id, superseded=False)
        .order_by("id")
        .values_list("name", flat=True)
    )
    return list(dict.fromkeys(names))


def retry_refused(run: Any) -> str | None:
    """Why the run page offers no Retry for a failed or canceled run (a child whose parent has
    finished), or None. `run.parent_run` is loaded with the run."""
    if run.status not in RETRYABLE:
        return None
    parent = run.parent_run
    return why_not_retryable(run.status, run.parent_run_id, parent.status if parent else None)


class RetryMixin(OperatorActionsMixin):
    """Adds `<run id>/retry/` and the `retry_selected` action to the runs' ModelAdmin."""

    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.may(request, RETRY, obj)

    def retry_urls(self) -> list[Any]:
        return [self.action_url(RETRY, self.retry_view)]

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page with a reason and a step picker. POST: retry."""

        def retry_one(run: Any, reason: str) -> bool:
            from_step = request.POST.get("from_step", "").strip() or None
            try:
                retried = self._retry(request, run, reason, from_step)
            except UnknownStepError as exc:
                messages.error(request, str(exc))
                return False
            if retried:
                since = f" from step {from_step}" if from_step else ""
                messages.success(request, format_html("Run {} retried{}.", run.pk, since))
            else:
                why = engine.retry_refusal(run.pk) or "it changed meanwhile"
                text = format_html("Run {} was not retried: {}; nothing changed.", run.pk, why)
                messages.warning(request, text)
            return retried

        return self.confirm_or_act(
            request, object_id, RETRY, retry_one, lambda run: {"steps": step_choices(run.pk)}
        )

    @admin.action(description="Retry selected runs (failed or canceled)", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        return self.confirm_or_act_on_selected(
            request, queryset, RETRY, lambda run, reason: self._retry(request, run, reason, None)
        )

    def _retry(self, request: HttpRequest, run: Any, reason: str, from_step: str | None) -> bool:
        by = request.user.get_username()
        retried = engine.retry_run(run.pk, from_step=from_step, reason=reason, by=by)
        if retried:
            verb = RETRY.logged_as + (f" from step {from_step}" if from_step else "")
            self.log(request, run, verb, reason)
        return retried
