"""UMT's admin: adding a plan publishes its outbox event; what the workflow writes is read-only."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client

import tasks_engine
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tests.helpers import FakeClock, drain
from tests.umt.test_acquire import media as media
from tests.umt.test_acquire import rid, started, write
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
    item = LibraryItem.objects.create(
        plan=plan, title="x", path="/lib/x.mkv", size=1, hash_algorithm="xxh3_128", content_hash="0"
    )
    assert admin_client.get("/admin/umt/libraryitem/add/").status_code == 403
    url = f"/admin/umt/libraryitem/{item.pk}/change/"
    assert admin_client.get(url).status_code == 200  # a view-only page
    assert admin_client.post(url, {"title": "changed"}).status_code == 403
    assert admin_client.get("/admin/umt/libraryitem/").status_code == 200


def finished_plan(media: Path, fake_clock: FakeClock, name: str = "Sintel (2010)") -> Any:
    plan = started(name, retention_seconds=0)
    source = media / "downloads" / f"{name}.mkv"
    write(source, 300_000)  # several copy chunks: the last progress written mid-copy is < 100 %
    call_command("umt_download_done", f"plan:{plan.pk}", str(source), stdout=io.StringIO())
    drain(fake_clock)
    return plan


def test_a_finished_runs_page_shows_its_final_progress_and_its_ops_steps(
    admin_client: Client, media: Path, fake_clock: FakeClock
) -> None:
    plan = finished_plan(media, fake_clock)
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and run.status == "completed"
    page = admin_client.get(f"/admin/tasks_engine/workflowrun/{rid(plan)}/change/").content
    text = page.decode()
    assert "done: 1 file(s) in the library" in text
    assert "copying" not in text
    # The op-ledger table names the step each op ran in.
    assert re.search(r"submit:\d+</td>\s*<td[^>]*>submit-download", text), text
    assert re.search(r"umt:copy:plan:\d+</td>\s*<td[^>]*>copy-file", text), text


def test_the_plan_page_shows_its_run_and_a_failed_plan_is_retried_by_the_admin_action(
    admin_client: Client, media: Path, fake_clock: FakeClock
) -> None:
    plan = started("Gone Missing", retention_seconds=0)
    source = media / "downloads" / "gone.mkv"
    write(source, 1000)
    call_command("umt_download_done", f"plan:{plan.pk}", str(source), stdout=io.StringIO())
    source.unlink()  # reported, then lost before the copy: the run fails
    drain(fake_clock)
    plan.refresh_from_db()
    assert plan.status == "failed" and "does not exist" in plan.failure
    url = f"/admin/umt/acquisitionplan/{plan.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert f"/admin/tasks_engine/workflowrun/{rid(plan)}/change/" in page and "(failed)" in page

    resp = admin_client.post(
        "/admin/umt/acquisitionplan/",
        {"action": "retry_failed_plans", "_selected_action": [plan.pk]},
        follow=True,
    )
    assert "Retried 1 plan(s); 0 not failed." in resp.content.decode()
    plan.refresh_from_db()
    assert (plan.status, plan.failure, plan.retries) == ("planned", "", 1)
    drain(fake_clock)  # the old report is not taken again: its file is gone
    run = tasks_engine.get_run(rid(plan))
    assert run is not None and (run.status, run.waiting_on) == ("waiting", "fact:download-done")
    write(source, 1000)
    call_command("umt_download_done", f"plan:{plan.pk}", str(source), stdout=io.StringIO())
    drain(fake_clock)
    plan.refresh_from_db()
    assert plan.status == "done" and LibraryItem.objects.filter(plan=plan).count() == 1
    assert "(completed)" in admin_client.get(url).content.decode()


def test_retrying_plans_needs_the_run_retry_permission(client: Client) -> None:
    AcquisitionPlan.objects.create(title="x", source="x.mkv", status="failed")
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_acquisitionplan"))
    client.force_login(staff)
    page = client.get("/admin/umt/acquisitionplan/").content.decode()
    assert "retry_failed_plans" not in page
    staff.user_permissions.add(Permission.objects.get(codename="retry_workflowrun"))
    client.force_login(User.objects.get(pk=staff.pk))
    assert "retry_failed_plans" in client.get("/admin/umt/acquisitionplan/").content.decode()
