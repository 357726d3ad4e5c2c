"""The admin's queues page: limits and active runs per queue and per busiest key."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

import tasks_engine
from tests.engine.transitions.test_flow_control import _plain_claims_after, claim, limit_queues

pytestmark = pytest.mark.django_db
_ = _plain_claims_after
URL = "/admin/tasks_engine/workflowrun/queues/"


def test_queues_page_shows_limits_counts_and_keys(admin_client: Client, settings: Any) -> None:
    io_limits = {"concurrency": 4, "rate_limit": "30/m", "worker_concurrency": 2}
    limit_queues(settings, {"flow-io": io_limits})
    for _ in range(3):
        tasks_engine.enqueue("flow-plain", {})
    for _ in range(4):
        tasks_engine.enqueue("flow-disk", {"disk": "busy"})
    claim(2, ["flow-io"])
    claim(5, ["default"])
    page = admin_client.get(URL).content.decode()
    assert "4 at once, 30 per minute, 2 per worker" in page
    io = page.split('data-queue="flow-io"')[1].split("</tr>")[0]
    assert [c.split(">")[-1] for c in io.split("</td>")[2:5]] == ["2", "1", "0"]
    busy = page.split('data-key="disk:busy"')[1].split("</tr>")[0]
    assert [c.split(">")[-1] for c in busy.split("</td>")[1:5]] == ["1", "1", "3", "0"]


def test_runs_list_links_to_the_queues_page(admin_client: Client) -> None:
    page = admin_client.get("/admin/tasks_engine/workflowrun/").content.decode()
    assert URL in page


def test_queues_page_needs_view_permission(client: Client, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("s", password="p", is_staff=True)
    client.force_login(user)
    assert client.get(URL).status_code == 403


def test_oldest_pending_is_the_longest_wait_of_a_due_run(
    admin_client: Client, fake_clock: Any
) -> None:
    """A run deferred to later is not waiting yet: it does not make the queue look stuck."""
    from datetime import timedelta

    tasks_engine.enqueue("flow-plain", {}, available_at=fake_clock.now() + timedelta(hours=5))
    fake_clock.advance(20 * 60)
    page = admin_client.get(URL).content.decode()
    io = page.split('data-queue="flow-io"')[1].split("</tr>")[0]
    assert io.split("</td>")[5].split(">")[-1] == "-"  # pending, but not due
    tasks_engine.enqueue("flow-plain", {})
    fake_clock.advance(90)
    io = admin_client.get(URL).content.decode().split('data-queue="flow-io"')[1]
    assert io.split("</tr>")[0].split("</td>")[5].split(">")[-1] == "1 m 30 s"
