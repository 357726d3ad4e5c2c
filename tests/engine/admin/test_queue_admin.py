"""The Queues page: every known queue with its state and limits; pause/resume behind
tasks_engine.pause_queue, limits behind tasks_engine.change_queue (staff without: 403, nothing
changes); each change in the admin log with its reason."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

import tasks_engine
from tasks_engine.models import Queue
from tests.engine.admin.test_admin import staff_client

pytestmark = pytest.mark.django_db

PAGE = "admin:tasks_engine_workflowrun_queues"


def op_url(op: str, name: str) -> str:
    return reverse(f"admin:tasks_engine_workflowrun_queue_{op}", args=[name])


def rows() -> list[tuple[Any, ...]]:
    return list(Queue.objects.values_list("name", "paused", "reason", "concurrency", "rate_limit"))


def test_the_page_lists_settings_workflow_and_active_queues(settings: Any, admin_client) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"io": {"concurrency": 2}}}
    tasks_engine.enqueue("b", {}, queue="adhoc")
    tasks_engine.pause_queue("adhoc", reason="nas offline")
    page = admin_client.get(reverse(PAGE)).content.decode()
    for name in ("io", "adhoc", "flow-io", "default"):  # QUEUES, runs/row, a workflow's, default
        assert f'data-queue="{name}"' in page
    assert "nas offline" in page and "2 at once" in page
    assert op_url("resume", "adhoc") in page and op_url("limits", "io") in page


def test_pause_and_resume_with_a_reason_are_logged(admin_client) -> None:
    assert "Yes, pause" in admin_client.get(op_url("pause", "io")).content.decode()
    admin_client.post(op_url("pause", "io"), {"reason": "disk full"})
    assert rows() == [("io", True, "disk full", None, "")]
    admin_client.post(op_url("resume", "io"))
    assert rows() == [("io", False, "", None, "")]
    log = [e.change_message for e in LogEntry.objects.order_by("id")]
    assert log == ["Paused: disk full", "Resumed"]
    assert LogEntry.objects.filter(object_id="io").count() == 2


def test_limits_are_set_validated_and_logged(admin_client) -> None:
    page = admin_client.post(op_url("limits", "io"), {"concurrency": "0", "rate_limit": "x"})
    assert page.status_code == 200 and "must look like" in page.content.decode()
    assert rows() == [] and not LogEntry.objects.exists()
    admin_client.post(
        op_url("limits", "io"), {"concurrency": "3", "rate_limit": "10/m", "reason": "tuning"}
    )
    assert rows() == [("io", False, "", 3, "10/m")]
    io = next(v for v in tasks_engine.list_queues() if v.name == "io")
    assert io.overridden == ("concurrency", "rate_limit")
    admin_client.post(op_url("limits", "io"), {"concurrency": "", "rate_limit": ""})
    assert rows() == [("io", False, "", None, "")]
    messages = [e.change_message for e in LogEntry.objects.order_by("id")]
    assert messages[0] == "Limits set: concurrency 3, rate limit 10/m: tuning"


@pytest.mark.parametrize(
    ("perms", "op"),
    [
        (("view_workflowrun",), "pause"),
        (("view_workflowrun", "change_queue"), "pause"),
        (("view_workflowrun",), "limits"),
        (("view_workflowrun", "pause_queue"), "limits"),
    ],
)
def test_staff_without_the_permission_get_403_and_nothing_changes(
    perms: tuple[str, ...], op: str
) -> None:
    client = staff_client(*perms)
    assert client.get(op_url(op, "io")).status_code == 403
    answer = client.post(op_url(op, "io"), {"reason": "x", "concurrency": "1"})
    assert answer.status_code == 403
    assert rows() == [] and not LogEntry.objects.exists()
    page = client.get(reverse(PAGE)).content.decode()
    assert op_url(op, "io") not in page  # no button they could not use


def test_staff_with_the_permissions_may(settings: Any) -> None:
    client = staff_client("view_workflowrun", "pause_queue", "change_queue")
    client.post(op_url("pause", "io"), {"reason": "r"})
    client.post(op_url("limits", "io"), {"concurrency": "2"})
    assert rows() == [("io", True, "r", 2, "")]


def test_a_reason_too_long_changes_nothing(admin_client) -> None:
    admin_client.post(op_url("pause", "io"), {"reason": "r" * 2001})
    assert rows() == [] and not LogEntry.objects.exists()
