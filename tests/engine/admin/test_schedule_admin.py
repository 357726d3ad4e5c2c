"""The schedules admin: state columns, pause/resume behind tasks_engine.pause_schedule, and an
admin log entry with the reason for each change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from tasks_engine import schedules
from tasks_engine.models import Schedule, WorkflowRun
from tests.engine.admin.test_admin import GONE, staff_client
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db


@pytest.fixture
def nightly(settings: Any, fake_clock: FakeClock) -> Schedule:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}},
    }
    fake_clock.current = datetime(2026, 12, 1, 12, tzinfo=UTC)
    schedules.run_once()
    fake_clock.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    return Schedule.objects.get()


def url(view: str, *args: Any) -> str:
    return reverse(f"admin:tasks_engine_schedule_{view}", args=args)


def state() -> tuple[Any, ...]:
    return tuple(Schedule.objects.values_list("paused", "next_fire_at", "updated_at").get())


def test_the_list_shows_next_fire_last_run_and_a_button(admin_client: Client, nightly: Schedule):
    page = admin_client.get(url("changelist")).content.decode()
    run = WorkflowRun.objects.get()
    assert "nightly-scan" in page and "repeat_names" in page
    assert "2026-12-03 03:00:00 UTC" in page  # next fire
    assert str(run.pk)[-8:] in page  # last run, linked
    assert url("pause", nightly.pk) in page


@pytest.fixture
def missed(settings: Any, fake_clock: FakeClock) -> Schedule:
    """A schedule every minute whose leader last ran at 14:18:30 (next fire 14:19), seen at
    14:20:30 with no leader since: 14:19 and 14:20 are missed."""
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"minutely": {"task": "repeat_names", "cron": "* * * * *"}},
    }
    fake_clock.current = datetime(2026, 12, 1, 14, 18, 30, tzinfo=UTC)
    schedules.run_once()
    fake_clock.current = datetime(2026, 12, 1, 14, 20, 30, tzinfo=UTC)
    row = Schedule.objects.get()
    assert row.next_fire_at == datetime(2026, 12, 1, 14, 19, tzinfo=UTC)
    return row


def test_after_a_gap_the_list_and_page_show_the_slot_the_leader_fires(
    admin_client: Client, missed: Schedule
) -> None:
    for page in (
        admin_client.get(url("changelist")).content.decode(),
        admin_client.get(url("change", missed.pk)).content.decode(),
    ):
        assert "2026-12-01 14:20:00 UTC" in page and "missed" in page
        assert "14:19" not in page
    assert schedules.run_once() == {"fired": 1, "failed": 0}  # the leader runs again
    assert WorkflowRun.objects.get().idempotency_key == (
        "schedule:minutely:2026-12-01T14:20:00+00:00"
    )
    page = admin_client.get(url("changelist")).content.decode()
    assert "2026-12-01 14:21:00 UTC" in page and "missed" not in page


def test_a_paused_or_removed_schedule_shows_no_next_fire(
    admin_client: Client, missed: Schedule, settings: Any
) -> None:
    schedules.pause("minutely")
    for page in (
        admin_client.get(url("changelist")).content.decode(),
        admin_client.get(url("change", missed.pk)).content.decode(),
    ):
        assert "paused" in page and "2026-12-01 14:2" not in page
    schedules.resume("minutely")
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "SCHEDULES": {}}  # before any round
    page = admin_client.get(url("changelist")).content.decode()
    assert "removed" in page and "2026-12-01 14:2" not in page


def test_the_list_gives_a_defined_schedule_its_row(admin_client: Client, settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"fresh": {"task": "repeat_names", "cron": "0 3 * * *"}},
    }
    assert "fresh" in admin_client.get(url("changelist")).content.decode()
    assert Schedule.objects.get().name == "fresh"


def test_superuser_pauses_and_resumes_with_a_reason(admin_client: Client, nightly: Schedule):
    confirm = admin_client.get(url("pause", nightly.pk))
    assert confirm.status_code == 200 and b'name="reason"' in confirm.content
    response = admin_client.post(url("pause", nightly.pk), {"reason": "disk swap tonight"})
    assert response.status_code == 302
    assert Schedule.objects.get().paused
    page = admin_client.get(url("changelist")).content.decode()
    assert url("resume", nightly.pk) in page and "paused" in page
    admin_client.post(url("resume", nightly.pk), {"reason": "disk back"})
    assert not Schedule.objects.get().paused
    entries = LogEntry.objects.filter(object_id=str(nightly.pk)).order_by("id")
    assert [e.change_message for e in entries] == [
        "Paused: disk swap tonight",
        "Resumed: disk back",
    ]
    history = admin_client.get(url("history", nightly.pk)).content.decode()
    assert "Paused: disk swap tonight" in history


def test_the_schedule_page_has_the_button(admin_client: Client, nightly: Schedule) -> None:
    page = admin_client.get(url("change", nightly.pk)).content.decode()
    assert url("pause", nightly.pk) in page


def test_staff_without_the_permission_get_403_and_nothing_changes(nightly: Schedule) -> None:
    staff = staff_client("view_schedule")
    before = state()
    assert staff.get(url("changelist")).status_code == 200
    assert url("pause", nightly.pk) not in staff.get(url("change", nightly.pk)).content.decode()
    assert staff.get(url("pause", nightly.pk)).status_code == 403
    assert staff.post(url("pause", nightly.pk), {"reason": "x"}).status_code == 403
    action = {"action": "pause_selected", "_selected_action": [nightly.pk]}
    assert staff.post(url("changelist"), action).status_code == 403
    assert state() == before
    assert not LogEntry.objects.exists()


def test_the_permission_without_view_permission_is_403(nightly: Schedule) -> None:
    blind = staff_client("pause_schedule")
    assert blind.post(url("pause", nightly.pk), {"reason": "x"}).status_code == 403
    assert not Schedule.objects.get().paused


def test_staff_with_the_permission_use_the_actions(nightly: Schedule) -> None:
    operator = staff_client("view_schedule", "pause_schedule")
    action = {"action": "pause_selected", "_selected_action": [nightly.pk], "confirm": "yes"}
    assert operator.post(url("changelist"), action).status_code == 302
    assert Schedule.objects.get().paused
    action["action"] = "resume_selected"
    operator.post(url("changelist"), action)
    assert not Schedule.objects.get().paused
    assert LogEntry.objects.count() == 2


def test_the_buttons_are_shown_only_to_users_who_may_pause(nightly: Schedule) -> None:
    """A view-only user saw Pause/Resume on every row, and clicking one gave a 403."""
    viewer = staff_client("view_schedule")
    page = viewer.get(url("changelist")).content.decode()
    assert "nightly-scan" in page
    assert url("pause", nightly.pk) not in page and url("resume", nightly.pk) not in page
    assert "pause_selected" not in page and "resume_selected" not in page
    operator = staff_client("view_schedule", "pause_schedule")
    page = operator.get(url("changelist")).content.decode()
    assert url("pause", nightly.pk) in page and "pause_selected" in page


@pytest.mark.parametrize("op", ["pause", "resume"])
def test_the_list_actions_ask_for_a_reason_like_the_schedule_page(
    admin_client: Client, nightly: Schedule, op: str
) -> None:
    """As the docs say (each pause or resume asks for a reason), the list actions first show
    the confirmation with a reason field; they paused at once, logging no reason."""
    if op == "resume":
        schedules.pause(nightly.name)
    before = state()
    selected = {"action": f"{op}_selected", "_selected_action": [nightly.pk]}
    confirm = admin_client.post(url("changelist"), selected)
    assert confirm.status_code == 200
    page = confirm.content.decode()
    assert 'name="reason"' in page and "nightly-scan" in page
    assert 'name="confirm" value="yes"' in page and f'value="{op}_selected"' in page
    assert f'name="_selected_action" value="{nightly.pk}"' in page
    assert state() == before and not LogEntry.objects.exists()  # asking changes nothing
    done = admin_client.post(url("changelist"), {**selected, "confirm": "yes", "reason": "swap"})
    assert done.status_code == 302
    assert Schedule.objects.get().paused is (op == "pause")
    verb = {"pause": "Paused", "resume": "Resumed"}[op]
    assert list(LogEntry.objects.values_list("change_message", flat=True)) == [f"{verb}: swap"]


def test_rows_cannot_be_added_changed_or_deleted(admin_client: Client, nightly: Schedule) -> None:
    before = state()
    assert admin_client.get(url("add")).status_code == 403
    assert admin_client.post(url("change", nightly.pk), {"paused": "on"}).status_code == 403
    assert admin_client.post(url("delete", nightly.pk), {"post": "yes"}).status_code == 403
    assert state() == before


def test_a_removed_schedule_shows_without_buttons(
    admin_client: Client, nightly: Schedule, settings: Any
) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "SCHEDULES": {}}
    schedules.run_once()
    page = admin_client.get(url("changelist")).content.decode()
    assert "removed" in page and url("pause", nightly.pk) not in page
    admin_client.post(url("pause", nightly.pk), {"reason": "x"})
    assert not Schedule.objects.get().paused


def test_a_reason_with_a_nul_character_changes_nothing(
    admin_client: Client, nightly: Schedule
) -> None:
    """Its admin log entry could not be stored (PostgreSQL): the pause committed, then a 500."""
    response = admin_client.post(url("pause", nightly.pk), {"reason": "a\x00b"}, follow=True)
    assert response.status_code == 200 and b"NUL character" in response.content
    action = {
        "action": "pause_selected",
        "_selected_action": [nightly.pk],
        "confirm": "yes",
        "reason": "x\x00",
    }
    response = admin_client.post(url("changelist"), action, follow=True)
    assert response.status_code == 200 and b"NUL character" in response.content
    assert not Schedule.objects.get().paused and not LogEntry.objects.exists()


@pytest.mark.parametrize("op", ["pause", "resume"])
def test_an_unknown_schedule_is_answered_as_django_answers_an_unknown_object(
    admin_client: Client, nightly: Schedule, op: str
) -> None:
    """A warning naming the id and a redirect to the list (before: a bare 404)."""
    before = state()
    for method in (admin_client.get, admin_client.post):
        response = method(url(op, 999999), {"reason": "x"}, follow=True)
        assert response.redirect_chain == [(url("changelist"), 302)]
        text = response.content.decode()
        assert GONE.format("Schedule", 999999) in text
    assert state() == before and not LogEntry.objects.exists()
