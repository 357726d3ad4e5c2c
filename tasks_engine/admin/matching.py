"""The runs list's "cancel all N matching" and "retry all N matching": the action applies to
every run the list's filters and search match, not only a page or a selection.

`cancel-matching/?<the list's query>` (and `retry-matching/`): GET shows a confirmation page
with the count; POST acts through `operations/bulk.py` (batches, each in its own transaction,
the same transitions as a single cancel or retry). The same permissions as the single actions
(staff without them: 403, nothing changes); every run changed gets its admin log entry.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..db.alias import engine_alias
from ..models import WorkflowRun
from ..operations import bulk
from . import audit
from .cancel_actions import CANCEL
from .operator_actions import OperatorActionsMixin, RunAction, reason_from
from .retry_actions import RETRY

TEMPLATE = "admin/tasks_engine/workflowrun/matching_confirmation.html"


class MatchingMixin(OperatorActionsMixin):
    def matching_urls(self) -> list[Any]:
        return [
            path(
                f"{action.name}-matching/",
                self.admin_site.admin_view(view),
                name=f"tasks_engine_workflowrun_{action.name}_matching",
            )
            for action, view in (
                (CANCEL, self.cancel_matching_view),
                (RETRY, self.retry_matching_view),
            )
        ]

    def cancel_matching_view(self, request: HttpRequest) -> HttpResponse:
        return self._matching(
            request,
            CANCEL,
            lambda runs, reason, changed: bulk.cancel_queryset(runs, reason, changed=changed),
        )

    def retry_matching_view(self, request: HttpRequest) -> HttpResponse:
        by = f"admin:{request.user.get_username()}"
        return self._matching(
            request,
            RETRY,
            lambda runs, reason, changed: bulk.retry_queryset(runs, reason, by=by, changed=changed),
        )

    def _matching(
        self,
        request: HttpRequest,
        action: RunAction,
        act: Callable[[QuerySet[WorkflowRun], str, Callable[[list[uuid.UUID]], None]], int],
    ) -> HttpResponse:
        if not self.may(request, action):
            raise PermissionDenied
        query = request.GET.urlencode()
        list_url = reverse("admin:tasks_engine_workflowrun_changelist") + (
            f"?{query}" if query else ""
        )
        if not query:  # the whole table is not a filter
            messages.error(request, "Filter the list first: these actions act on a filter.")
            return HttpResponseRedirect(list_url)
        runs = self.get_changelist_instance(request).get_queryset(request)  # type: ignore[attr-defined]
        eligible = runs.filter(status__in=list(action.statuses))
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            reason = reason_from(request)
            verb = action.logged_as

            def log(ids: list[uuid.UUID]) -> None:
                audit.record(request.user, WorkflowRun.objects.filter(pk__in=ids), verb, reason)

            try:
                done = act(runs.using(engine_alias()), reason, log)  # the primary's runs
            except ValueError as exc:  # a reason the engine refuses: nothing changed
                messages.error(request, str(exc))
                return HttpResponseRedirect(request.get_full_path())
            messages.success(request, f"{verb} {done} matching run(s).")
            return HttpResponseRedirect(list_url)
        page = {
            **self.admin_site.each_context(request),
            "title": f"{action.title.split()[0]} all matching runs",
            "opts": self.model._meta,
            "verb": action.name,
            "count": eligible.count(),
            "filters": [(k, v) for k, values in request.GET.lists() for v in values],
            "form_action": request.get_full_path(),
            "back_url": list_url,
        }
        return TemplateResponse(request, TEMPLATE, page)
