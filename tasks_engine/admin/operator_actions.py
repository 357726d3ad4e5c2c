"""What the admin's operator actions on runs (cancel, retry) share.

Each action has a run-page URL `<run id>/<name>/` (GET: a confirmation form, POST: do it) and a
changelist action `<name>_selected`. Both need the action's permission AND the view permission
on runs (a user who cannot see a run cannot act on it: 403, nothing changes), both go through
the engine API (never the ORM), and every run acted on gets an admin log entry with the user
and the reason (`audit.record`), shown on the run's history page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext as _

from ..exceptions import UnknownRunError
from ..values.serialization import REASON_MAX_LENGTH
from . import audit

MAX_REASON = REASON_MAX_LENGTH
MAX_BULK = 1000  # runs per action submission; repeat the action for more


def reason_from(request: HttpRequest) -> str:
    """Whole: a reason past the limit is refused by the engine (a message, nothing changed),
    not cut short."""
    return request.POST.get("reason", "").strip()


def unknown_object(request: HttpRequest, opts: Any, object_id: str) -> HttpResponse:
    """What Django's admin answers for an unknown object (its change and history views): a
    warning naming the id, "... with ID "x" doesn't exist. Perhaps it was deleted?" (Django's
    own, translated, text), and a redirect; here to the model's list rather than the admin
    index, since a run is usually looked for there (a pruned run, a mistyped id)."""
    message = _("%(name)s with ID “%(key)s” doesn’t exist. Perhaps it was deleted?") % {  # noqa: RUF001
        "name": opts.verbose_name,
        "key": unquote(object_id),
    }
    messages.warning(request, message)
    return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))


@dataclass(frozen=True)
class RunAction:
    name: str  # "cancel": the URL <run id>/cancel/ and the action cancel_selected
    permission: str  # "tasks_engine.cancel_workflowrun"
    statuses: frozenset[str]  # the runs it applies to
    title: str  # "Cancel run"
    template: str
    logged_as: str  # the admin log's verb: "Canceled"
    done: str  # the list action's message: "Retried {n} run(s)."
    # Or a message from the runs it acted on, read after the action (cancel tells runs canceled
    # at once from running ones asked to stop).
    done_message: Callable[[list[Any]], str] | None = None


class OperatorActionsMixin:
    """The shared views; CancelMixin and RetryMixin declare their RunAction and what it does."""

    admin_site: admin.AdminSite
    model: Any

    def may(self, request: HttpRequest, action: RunAction, obj: Any = None) -> bool:
        if not request.user.has_perm(action.permission):
            return False
        return bool(self.has_view_permission(request, obj))  # type: ignore[attr-defined]

    def action_url(self, action: RunAction, view: Callable[..., HttpResponse]) -> Any:
        info = (self.model._meta.app_label, self.model._meta.model_name, action.name)
        return path(
            f"<path:object_id>/{action.name}/",
            self.admin_site.admin_view(view),
            name="{}_{}_{}".format(*info),
        )

    def confirm_or_act(
        self,
        request: HttpRequest,
        object_id: str,
        action: RunAction,
        act: Callable[[Any, str], bool],
        page_context: Callable[[Any], dict[str, Any]] | None = None,
    ) -> HttpResponse:
        """GET: the confirmation page. POST: `act(run, reason)`, then back to the run page."""
        if not self.may(request, action):
            raise PermissionDenied
        run = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if run is None:
            return unknown_object(request, self.model._meta, object_id)
        run_url = reverse("admin:tasks_engine_workflowrun_change", args=[run.pk])
        if request.method == "POST":
            try:
                act(run, reason_from(request))
            except UnknownRunError:  # pruned since the page was shown
                return unknown_object(request, self.model._meta, object_id)
            except ValueError as exc:  # a reason the engine refuses: nothing was changed
                messages.error(request, str(exc))
                return HttpResponseRedirect(request.path)
            return HttpResponseRedirect(run_url)
        page = {
            **self.admin_site.each_context(request),
            "title": action.title,
            "opts": self.model._meta,
            "runs": [run],
            "single": True,
            "form_action": request.path,
            "back_url": run_url,
            **(page_context(run) if page_context else {}),
        }
        return TemplateResponse(request, action.template, page)

    def confirm_or_act_on_selected(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        action: RunAction,
        act: Callable[[Any, str], bool],
    ) -> HttpResponse | None:
        """The `<name>_selected` list action: a confirmation page, then `act` on each run the
        action applies to (at most MAX_BULK per submission)."""
        eligible = queryset.filter(status__in=list(action.statuses)).order_by("-created_at")
        if request.POST.get("confirm") != "yes":
            runs = list(
                eligible.only("id", "task_name", "version", "status", "created_at")[:MAX_BULK]
            )
            page = {
                **self.admin_site.each_context(request),
                "title": action.title.replace("run", "runs"),
                "opts": self.model._meta,
                "runs": runs,
                "single": False,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "action_name": f"{action.name}_selected",
                "back_url": request.get_full_path(),
                "max_bulk": MAX_BULK,
            }
            return TemplateResponse(request, action.template, page)
        reason = reason_from(request)
        acted: list[Any] = []
        for run in eligible[:MAX_BULK]:
            try:
                if act(run, reason):
                    acted.append(run.pk)
            except UnknownRunError:  # pruned between the page and the click
                continue
            except ValueError as exc:  # a reason the engine refuses, for every run alike
                messages.error(request, str(exc))
                return None
        if action.done_message is not None:
            messages.success(request, action.done_message(acted))
        else:
            messages.success(request, action.done.format(n=len(acted)))
        if len(acted) == MAX_BULK:
            messages.info(request, f"At most {MAX_BULK} runs per action; run it again.")
        return None

    def refuse_unpermitted_actions(self, request: HttpRequest, actions: list[RunAction]) -> None:
        """Django drops actions the user may not run and answers "no action selected"; 403."""
        if request.method != "POST":
            return
        for action in actions:
            chosen = request.POST.get("action") == f"{action.name}_selected"
            if chosen and not self.may(request, action):
                raise PermissionDenied

    @staticmethod
    def log(request: HttpRequest, run: Any, verb: str, reason: str) -> None:
        audit.record(request.user, [run], verb, reason)
