"""A list action posted with a malformed `_selected_action` id: a clear error, nothing written.

Django's admin filters the list by `pk__in` the posted ids, and the primary key's field refuses
one it cannot read: "not-a-uuid" for a run's UUID, "x" or an integer past 64 bits for a
schedule's or an event's number. That was a 500 (ValidationError, ValueError, or on PostgreSQL
a DataError), whether or not the action had been confirmed. Now every list action of the
engine's admin and the outbox's answers as Django answers "no action selected": a message and a
redirect back to the list, with no row changed and no admin log entry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from outbox import publish
from outbox.models import OutboxEvent
from tasks_engine import schedules
from tasks_engine.models import Schedule, WorkflowRun
from tests.browser.rundata import make_run
from tests.engine.admin.test_admin import VIEW_ALL, staff_client
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

BAD_UUIDS = ["not-a-uuid", "", "1234", "a\x00b"]
BAD_NUMBERS = ["not-a-number", "", "1.5", "99999999999999999999", "1\x00"]


def everything() -> list[tuple]:
    return [
        tuple(
            WorkflowRun.objects.order_by("pk").values_list(
                "pk", "status", "cancel_requested_at", "cancel_reason", "retries", "updated_at"
            )
        ),
        tuple(Schedule.objects.order_by("pk").values_list("pk", "paused", "updated_at")),
        tuple(OutboxEvent.objects.order_by("pk").values_list("pk", "status", "attempts")),
        tuple(LogEntry.objects.values_list("pk")),
    ]


def refused(client: Client, changelist: str, data: dict[str, Any], bad: str) -> None:
    """Posting `data` redirects back to the list with an error naming `bad`; nothing changes."""
    before = everything()
    response = client.post(changelist, data)
    assert response.status_code == 302
    assert response["Location"] == changelist
    page = client.get(response["Location"])
    assert page.status_code == 200
    shown = [str(m) for m in page.context["messages"]]
    assert any("is not a valid id" in m and "nothing was changed" in m for m in shown), shown
    assert any(repr(bad) in m for m in shown), shown
    assert everything() == before


@pytest.mark.parametrize("bad", BAD_UUIDS)
@pytest.mark.parametrize("name", ["cancel_selected", "retry_selected"])
@pytest.mark.parametrize("confirm", [{}, {"confirm": "yes", "reason": "bulk"}])
def test_a_run_action_with_a_malformed_run_id_is_refused(
    name: str, bad: str, confirm: dict[str, str]
) -> None:
    operator = staff_client(*VIEW_ALL, "cancel_workflowrun", "retry_workflowrun")
    waiting, failed = make_run("waiting", waiting_on="sleep:nap"), make_run("failed")
    changelist = reverse("admin:tasks_engine_workflowrun_changelist")
    data = {"action": name, "_selected_action": [str(waiting.pk), str(failed.pk), bad], **confirm}
    refused(operator, changelist, data, bad)


@pytest.fixture
def nightly(settings: Any, fake_clock: FakeClock) -> Schedule:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}},
    }
    fake_clock.current = datetime(2026, 12, 1, 12, tzinfo=UTC)
    schedules.run_once()
    return Schedule.objects.get()


@pytest.mark.parametrize("bad", BAD_NUMBERS)
@pytest.mark.parametrize("name", ["pause_selected", "resume_selected"])
@pytest.mark.parametrize("confirm", [{}, {"confirm": "yes", "reason": "swap"}])
def test_a_schedule_action_with_a_malformed_id_is_refused(
    nightly: Schedule, name: str, bad: str, confirm: dict[str, str]
) -> None:
    if name == "resume_selected":
        schedules.pause(nightly.name)
    operator = staff_client("view_schedule", "pause_schedule")
    changelist = reverse("admin:tasks_engine_schedule_changelist")
    data = {"action": name, "_selected_action": [str(nightly.pk), bad], **confirm}
    refused(operator, changelist, data, bad)


@pytest.mark.parametrize("bad", BAD_NUMBERS)
def test_the_outbox_retry_with_a_malformed_event_id_is_refused(bad: str) -> None:
    event = publish("test.needs_marker", {"key": "d"}, idempotency_key="idem-d", max_attempts=1)
    OutboxEvent.objects.filter(pk=event.pk).update(status="dead")
    operator = staff_client("view_outboxevent", "retry_outboxevent")
    changelist = reverse("admin:outbox_outboxevent_changelist")
    data = {"action": "retry_selected", "index": 0, "_selected_action": [str(event.pk), bad]}
    refused(operator, changelist, data, bad)


def test_a_well_formed_selection_still_acts() -> None:
    operator = staff_client(*VIEW_ALL, "cancel_workflowrun")
    run = make_run("waiting", waiting_on="sleep:nap")
    changelist = reverse("admin:tasks_engine_workflowrun_changelist")
    data = {"action": "cancel_selected", "_selected_action": [str(run.pk)], "confirm": "yes"}
    assert operator.post(changelist, {**data, "reason": "ok"}).status_code == 302
    run.refresh_from_db()
    assert run.status == "canceled"
