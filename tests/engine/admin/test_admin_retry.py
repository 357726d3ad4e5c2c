"""Retry from the admin: the run page's button (reason, step picker) and retry_selected, both
guarded by tasks_engine.retry_workflowrun and the view permission (403, nothing changes);
every cancel and retry from the admin is in the run's history with the user and the reason."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine.admin import WorkflowRunAdmin
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.engine.admin.test_admin import MODELS, VIEW_ALL, staff_client
from tests.helpers import FakeClock, drain
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


def url(view: str, *args: Any) -> str:
    return reverse(f"admin:tasks_engine_workflowrun_{view}", args=args)


def failed_run(fake: FakeClock, key: str, **extra: Any) -> uuid.UUID:
    run_id = tasks_engine.enqueue("gated", {"key": key, **extra}).run_id
    drain(fake)
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    return run_id


def state() -> list[tuple]:
    return [
        tuple(
            WorkflowRun.objects.order_by("pk").values_list(
                "pk", "status", "updated_at", "retries", "error"
            )
        ),
        tuple(StepAttempt.objects.order_by("pk").values_list("pk", "status", "superseded")),
        tuple(LogEntry.objects.values_list("pk")),
    ]


def action(client: Client, ids: list, name: str = "retry_selected", **extra: str):
    data = {"action": name, "_selected_action": [str(i) for i in ids], **extra}
    return client.post(url("changelist"), data)


def history(run_id: uuid.UUID) -> list[tuple[str, str]]:
    entries = LogEntry.objects.filter(object_id=str(run_id)).order_by("pk")
    return [(e.user.get_username(), e.change_message) for e in entries]


def test_run_page_retry_with_reason_and_step(fake_clock: FakeClock, admin_client: Client) -> None:
    run_id = failed_run(fake_clock, "ad", gate_step="c")
    page = admin_client.get(url("change", run_id))
    assert b'id="retry-form"' in page.content
    assert url("retry", run_id).encode() in page.content
    assert b'<option value="b">b</option>' in page.content  # the step picker
    confirm = admin_client.get(url("retry", run_id))
    assert confirm.status_code == 200
    assert b'name="reason"' in confirm.content and b'name="from_step"' in confirm.content
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"  # GET changes nothing
    Marker.objects.create(key="ad:open")
    response = admin_client.post(url("retry", run_id), {"reason": "fixed", "from_step": "b"})
    assert (response.status_code, response["Location"]) == (302, url("change", run_id))
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "pending"
    assert [(r["by"], r["reason"], r["from_step"]) for r in run.retries or []] == [
        ("admin", "fixed", "b")
    ]
    assert history(run_id) == [("admin", "Retried from step b: fixed")]
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    assert SideEffect.objects.filter(key="ad:a").count() == 1
    page = admin_client.get(url("change", run_id))
    assert page.content.count(b"te-superseded-note") == 2  # b and c of the first pass
    assert b'id="retries"' in page.content and b"fixed" in page.content
    assert b'id="retry-form"' not in page.content  # completed: nothing to retry
    hist = admin_client.get(url("history", run_id))
    assert b"Retried from step b: fixed" in hist.content


def test_retry_of_an_unknown_step_from_the_admin_changes_nothing(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    run_id = failed_run(fake_clock, "us")
    before = state()
    response = admin_client.post(url("retry", run_id), {"reason": "x", "from_step": "nope"})
    assert response.status_code == 302
    assert state() == before


def test_retry_of_a_completed_run_from_the_admin_changes_nothing(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    Marker.objects.create(key="cp:open")
    run_id = tasks_engine.enqueue("gated", {"key": "cp"}).run_id
    drain(fake_clock)
    before = state()
    response = admin_client.post(url("retry", run_id), {"reason": "again"}, follow=True)
    assert b"nothing changed" in response.content
    assert state() == before


def test_a_child_of_a_canceled_parent_is_not_retried_from_the_admin(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    from tests.engine.transitions.test_retry import canceled_family

    parent_id, child_id = canceled_family(fake_clock)
    before = state()
    page = admin_client.get(url("change", child_id)).content.decode()
    assert 'id="retry-form"' not in page
    assert f"its parent run {parent_id} is canceled; retry the parent instead" in page
    response = admin_client.post(url("retry", child_id), {"reason": "alone"}, follow=True)
    assert (
        f"Run {child_id} was not retried: its parent run {parent_id} is canceled; retry the"
        " parent instead; nothing changed." in response.content.decode()
    )
    assert state() == before
    action(admin_client, [child_id], confirm="yes", reason="bulk")
    assert state() == before


def test_staff_without_the_retry_permission_get_403_and_nothing_changes(
    fake_clock: FakeClock,
) -> None:
    run_id = failed_run(fake_clock, "np")
    staff = staff_client(*VIEW_ALL, "cancel_workflowrun")
    before = state()
    page = staff.get(url("change", run_id))
    assert page.status_code == 200 and b'id="retry-form"' not in page.content
    assert staff.get(url("retry", run_id)).status_code == 403
    assert staff.post(url("retry", run_id), {"reason": "x"}).status_code == 403
    assert b"retry_selected" not in staff.get(url("changelist")).content
    assert action(staff, [run_id]).status_code == 403
    assert action(staff, [run_id], confirm="yes", reason="x").status_code == 403
    assert state() == before


def test_the_retry_permission_without_the_view_permission_gets_403(fake_clock: FakeClock) -> None:
    run_id = failed_run(fake_clock, "nv")
    blind = staff_client(*(f"view_{m}" for m in MODELS if m != "workflowrun"), "retry_workflowrun")
    before = state()
    assert blind.get(url("retry", run_id)).status_code == 403
    assert blind.post(url("retry", run_id), {"reason": "x"}).status_code == 403
    assert action(blind, [run_id], confirm="yes").status_code == 403
    assert state() == before


def test_staff_with_the_permission_retry(fake_clock: FakeClock) -> None:
    run_id = failed_run(fake_clock, "sp")
    retrier = staff_client(*VIEW_ALL, "retry_workflowrun")
    assert b'id="retry-form"' in retrier.get(url("change", run_id)).content
    assert retrier.post(url("retry", run_id), {"reason": "ok"}).status_code == 302
    assert WorkflowRun.objects.get(pk=run_id).status == "pending"


def test_retry_selected_confirms_then_retries_failed_and_canceled_runs(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    failed = failed_run(fake_clock, "b1")
    canceled = tasks_engine.enqueue("gated", {"key": "b2"}).run_id
    tasks_engine.cancel(canceled, "first")
    pending = tasks_engine.enqueue("gated", {"key": "b3"}).run_id
    before = state()
    confirm = action(admin_client, [failed, canceled, pending])
    assert confirm.status_code == 200
    assert b'name="reason"' in confirm.content and b'value="retry_selected"' in confirm.content
    assert str(failed).encode() in confirm.content and str(pending).encode() not in confirm.content
    assert state() == before
    response = action(admin_client, [failed, canceled, pending], confirm="yes", reason="bulk")
    assert response.status_code == 302
    statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
    assert statuses == {failed: "pending", canceled: "pending", pending: "pending"}
    assert WorkflowRun.objects.get(pk=pending).retries is None
    assert history(failed) == history(canceled) == [("admin", "Retried: bulk")]
    assert history(pending) == []


def test_every_cancel_from_the_admin_is_in_the_run_history(admin_client: Client) -> None:
    one = tasks_engine.enqueue("gated", {"key": "c1"}).run_id
    two = tasks_engine.enqueue("gated", {"key": "c2"}).run_id
    admin_client.post(url("cancel", one), {"reason": "duplicate"})
    action(admin_client, [two], name="cancel_selected", confirm="yes", reason="cleanup")
    assert history(one) == [("admin", "Canceled: duplicate")]
    assert history(two) == [("admin", "Canceled: cleanup")]
    assert b"Canceled: duplicate" in admin_client.get(url("history", one)).content
    # A cancel that changes nothing (finished already) writes no entry.
    admin_client.post(url("cancel", one), {"reason": "again"})
    assert len(history(one)) == 1


def test_superusers_have_the_retry_permission() -> None:
    root = User.objects.create_superuser("root2", "r@example.com", "pw")
    assert root.has_perm("tasks_engine.retry_workflowrun")


def test_a_from_step_with_a_nul_character_is_a_clear_error(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    """No step has one; on PostgreSQL the lookup's statement failed (a 500 in the admin)."""
    run_id = failed_run(fake_clock, "nul", gate_step="c")
    with pytest.raises(tasks_engine.UnknownStepError):
        tasks_engine.retry_run(run_id, from_step="a\x00b")
    response = admin_client.post(url("retry", run_id), {"from_step": "a\x00b"}, follow=True)
    assert response.status_code == 200
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"


def test_the_retry_history_shows_its_time_as_the_page_shows_its_other_times(
    fake_clock: FakeClock, admin_client: Client, settings: Any
) -> None:
    """Formatted like the page's other times (Django's date filter, in the current time
    zone), with the stored ISO string kept as its machine-readable form; it was the raw ISO
    string."""
    settings.TIME_ZONE = "Europe/Berlin"
    run_id = failed_run(fake_clock, "at")
    fake_clock.current = datetime(2026, 3, 1, 12, 0, 5, 250000, tzinfo=UTC)
    admin_client.post(url("retry", run_id), {"reason": "disk replaced"})
    stored = (WorkflowRun.objects.get(pk=run_id).retries or [])[0]["at"]
    assert stored == "2026-03-01T12:00:05.250000+00:00"
    page = admin_client.get(url("change", run_id)).content.decode()
    cell = page.split('class="te-mono te-retry-at">', 1)[1].split("</td>", 1)[0]
    assert cell == f'<time datetime="{stored}" title="{stored}">2026-03-01 13:00:05</time>'
    created = WorkflowRun.objects.get(pk=run_id).created_at
    assert (
        f"<dt>created</dt><dd>{created.astimezone(ZoneInfo('Europe/Berlin')):%Y-%m-%d %H:%M:%S}"
        in page
    )


def run_card(page: str, key: str) -> str:
    """The text of the run page's <dd> after <dt>key</dt>, tags removed."""
    cell = page.split(f"<dt>{key}</dt>", 1)[1].split("</dd>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", " ", cell).split())


def test_after_a_retry_the_run_page_shows_no_worker_and_counts_from_the_retry(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    """The old attempt's worker holds nothing, and the hours the run sat failed are not its
    duration; before, the page showed the failed pass's worker and a duration from the first
    start."""
    run_id = failed_run(fake_clock, "pw")
    assert WorkflowRun.objects.get(pk=run_id).worker_id == "test-worker"
    page = admin_client.get(url("change", run_id)).content.decode()
    assert run_card(page, "last worker") == "test-worker"  # failed: none holds it now
    fake_clock.advance(2 * 3600)
    admin_client.post(url("retry", run_id), {"reason": "disk replaced"})
    assert WorkflowRun.objects.get(pk=run_id).worker_id == ""  # retry_run cleared it
    page = admin_client.get(url("change", run_id)).content.decode()
    assert "test-worker" not in page
    assert run_card(page, "worker") == "none: not claimed since the retry"
    assert run_card(page, "duration") == "- not started since the retry"
    assert "<dt>first started</dt>" in page and 'id="retried-at"' in page
    listed = admin_client.get(url("changelist")).context["cl"].result_list
    assert [admin_site_duration(r) for r in listed] == [""]

    Marker.objects.create(key="pw:open")
    fake_clock.advance(30)
    drain(fake_clock, worker_id="second-worker")
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == "completed" and run.worker_id == "second-worker"
    page = admin_client.get(url("change", run_id)).content.decode()
    assert run_card(page, "last worker") == "second-worker"
    assert run_card(page, "duration") == "30.0 s since the retry"
    listed = admin_client.get(url("changelist")).context["cl"].result_list
    assert [admin_site_duration(r) for r in listed] == ["30.0 s"]


def admin_site_duration(run: WorkflowRun) -> str:
    """The runs list's duration column for `run`."""
    model_admin = admin.site.get_model_admin(WorkflowRun)
    assert isinstance(model_admin, WorkflowRunAdmin)
    return model_admin.duration(run)


def test_a_retry_reason_longer_than_the_limit_is_refused_and_nothing_changes(
    fake_clock: FakeClock, admin_client: Client
) -> None:
    run_id = failed_run(fake_clock, "long-reason")
    before = state()
    long = "r" * 2001
    response = admin_client.post(url("retry", run_id), {"reason": long}, follow=True)
    assert response.status_code == 200
    assert b"eason is 2001 characters long: at most 2000" in response.content
    response = action(admin_client, [run_id], confirm="yes", reason=long)
    assert state() == before
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
