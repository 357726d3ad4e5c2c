"""Deliver a fact from the admin: the run page's "Deliver a fact…" button on a run that waits
on a fact, and its form at `<run id>/deliver_fact/` (GET: the form, POST: deliver).

It needs the permission `tasks_engine.deliver_fact_workflowrun` beside the view permission on
runs (staff without it see no button and get 403 at the URL, nothing stored), goes through the
public `tasks_engine.engine.signal` (never the ORM), and writes an admin log entry with the
user, the fact's name and the reason, shown on the run's history page.

Bad input (a payload that is not JSON, a name or reason the engine refuses, a stale form) is a
one-line message with the form kept as typed, and nothing is stored. Each form carries a
one-time token, sent as the signal's idempotency key: a form submitted twice (a double click,
a reload) stores one fact and logs one entry.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from .. import engine
from ..exceptions import UnknownRunError
from ..models import Fact, WorkflowRun
from ..states import FINISHED
from ..values.serialization import check_reason
from . import audit
from .operator_actions import MAX_REASON, unknown_object

DELIVER_PERMISSION = "tasks_engine.deliver_fact_workflowrun"
TOKEN = re.compile(r"^[0-9a-f]{32}$")


def waits_on_fact(run: WorkflowRun) -> str | None:
    """The fact's name a waiting run waits on ("download-done"), else None."""
    if run.status != "waiting" or not run.waiting_on.startswith("fact:"):
        return None
    return run.waiting_on.removeprefix("fact:")


def idempotency_key(token: str) -> str:
    return f"admin-deliver:{token}"


class FactForm:
    """The form's fields, read from a POST; `problem` says in one line what is wrong."""

    def __init__(self, data: Any) -> None:
        self.name = str(data.get("name", "")).strip()
        self.payload_text = str(data.get("payload", ""))
        self.reason = reason_from_data(data)
        self.token = str(data.get("token", ""))
        self.payload: Any = None
        self.problem = self._check()

    def _check(self) -> str | None:
        if not TOKEN.match(self.token):
            return "This form is out of date (no valid form token): open it again"
        if not self.name:
            return "The fact's name is empty"
        try:
            check_reason(self.reason)
        except ValueError as exc:
            return f"The {exc}"
        text = self.payload_text.strip()
        if not text:
            return None  # no payload: null
        try:
            self.payload = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"The payload is not valid JSON ({exc})"
        return None


def reason_from_data(data: Any) -> str:
    return str(data.get("reason", "")).strip()


class DeliverFactMixin:
    """Adds `<run id>/deliver_fact/` to the runs' ModelAdmin."""

    admin_site: Any
    model: Any

    def has_deliver_fact_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if not request.user.has_perm(DELIVER_PERMISSION):
            return False
        return bool(self.has_view_permission(request, obj))  # type: ignore[attr-defined]

    def deliver_fact_urls(self) -> list[Any]:
        return [
            path(
                "<path:object_id>/deliver_fact/",
                self.admin_site.admin_view(self.deliver_fact_view),
                name="tasks_engine_workflowrun_deliver_fact",
            )
        ]

    def deliver_fact_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_deliver_fact_permission(request):
            raise PermissionDenied
        run = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if run is None:
            return unknown_object(request, self.model._meta, object_id)
        run_url = reverse("admin:tasks_engine_workflowrun_change", args=[run.pk])
        if run.status in FINISHED:
            messages.warning(
                request, format_html("Run {} has {}: no fact can be delivered.", run.pk, run.status)
            )
            return HttpResponseRedirect(run_url)
        if request.method != "POST":
            name = waits_on_fact(run) or ""
            return self._fact_form(request, run, run_url, name=name, token=uuid.uuid4().hex)
        form = FactForm(request.POST)
        if form.problem:
            messages.error(request, f"{form.problem}; nothing delivered.")
            return self._fact_form_again(request, run, run_url, form)
        key = idempotency_key(form.token)
        repeat = Fact.objects.filter(run_id=run.pk, idempotency_key=key).exists()
        try:
            answer = engine.signal(run.pk, form.name, form.payload, idempotency_key=key)
        except UnknownRunError:  # pruned since the form was shown
            return unknown_object(request, self.model._meta, object_id)
        except ValueError as exc:  # a name the engine refuses, a payload it cannot store
            messages.error(request, f"{' '.join(str(exc).split())}; nothing delivered.")
            return self._fact_form_again(request, run, run_url, form)
        if repeat:
            messages.info(
                request, f"This form was already submitted: fact {form.name} was delivered once."
            )
        elif answer.delivered:
            audit.record(request.user, [run], f"Delivered fact {form.name}", form.reason)
            messages.success(
                request,
                format_html(
                    "Fact {} delivered to run {}; the run is {} now.",
                    form.name,
                    run.pk,
                    answer.status,
                ),
            )
        else:
            messages.warning(
                request,
                format_html(
                    "Run {} is {}: fact {} was not delivered.", run.pk, answer.status, form.name
                ),
            )
        return HttpResponseRedirect(run_url)

    def _fact_form_again(
        self, request: HttpRequest, run: WorkflowRun, run_url: str, form: FactForm
    ) -> HttpResponse:
        """The form as submitted, after an error (a new token when the old one was malformed)."""
        return self._fact_form(
            request,
            run,
            run_url,
            name=form.name,
            payload=form.payload_text,
            reason=form.reason,
            token=form.token if TOKEN.match(form.token) else uuid.uuid4().hex,
        )

    def _fact_form(
        self, request: HttpRequest, run: WorkflowRun, run_url: str, **fields: Any
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": "Deliver a fact",
            "opts": self.model._meta,
            "run": run,
            "waits_on": waits_on_fact(run),
            "back_url": run_url,
            "form_action": request.path,
            "reason_max": MAX_REASON,
            **{"name": "", "payload": "", "reason": "", **fields},
        }
        return TemplateResponse(
            request, "admin/tasks_engine/workflowrun/deliver_fact.html", context
        )
