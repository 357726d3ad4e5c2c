"""UMT's admin: adding a plan publishes its outbox event; what the workflow writes is read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from outbox.models import OutboxEvent
from outbox.relay import relay_once
from umt.acquisition import PLANNED
from umt.models import AcquisitionPlan, LibraryItem

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client) -> Client:
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def test_adding_a_plan_in_the_admin_starts_its_run(admin_client: Client) -> None:
    resp = admin_client.post(
        "/admin/umt/acquisitionplan/add/",
        {"title": "Spring (2019)", "client": "folder", "source": "spring.mkv"},
    )
    assert resp.status_code == 302, resp.content.decode()[:2000]
    plan = AcquisitionPlan.objects.get()
    event = OutboxEvent.objects.get()
    assert (event.type, event.payload) == (PLANNED, {"plan_id": plan.pk})
    relay_once()
    plan.refresh_from_db()
    url = f"/admin/umt/acquisitionplan/{plan.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert f"/admin/tasks_engine/workflowrun/{plan.run_id}/change/" in page
    assert 'name="title"' not in page  # the workflow owns the plan now
    assert admin_client.post(url, {"title": "changed"}).status_code == 403
    assert admin_client.get(f"/admin/umt/acquisitionplan/{plan.pk}/delete/").status_code == 403


def test_library_items_cannot_be_added_or_changed(admin_client: Client) -> None:
    plan = AcquisitionPlan.objects.create(title="x", source="x.mkv")
    item = LibraryItem.objects.create(plan=plan, title="x", path="/lib/x.mkv", size=1, sha256="0")
    assert admin_client.get("/admin/umt/libraryitem/add/").status_code == 403
    url = f"/admin/umt/libraryitem/{item.pk}/change/"
    assert admin_client.get(url).status_code == 200  # a view-only page
    assert admin_client.post(url, {"title": "changed"}).status_code == 403
    assert admin_client.get("/admin/umt/libraryitem/").status_code == 200
