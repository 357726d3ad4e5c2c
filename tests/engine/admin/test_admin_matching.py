"""The runs list's "cancel all N matching" and "retry all N matching", and its tag:K=V search:
the whole filter after a confirmation page with the count, the single actions' permissions
(403, nothing changes), an admin log entry per run changed."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine.models import WorkflowRun
from tasks_engine.operations import bulk
from tests.engine.admin.test_admin import VIEW_ALL, staff_client
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def url(view: str) -> str:
    return reverse(f"admin:tasks_engine_workflowrun_{view}")


def runs_of_two_customers() -> None:
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(12)], tags={"customer": "42"})
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(3)], tags={"customer": "7"})


def test_the_list_searches_by_tag(admin_client: Client) -> None:
    runs_of_two_customers()
    page = admin_client.get(url("changelist"), {"q": "tag:customer=7"})
    assert page.status_code == 200
    assert page.context["cl"].result_count == 3
    assert "Cancel all 3 matching" in page.content.decode()
    bad = admin_client.get(url("changelist"), {"q": "tag:bad!=1"})
    assert bad.context["cl"].result_count == 0
    assert "must be 1 to 64 characters" in bad.content.decode()


def test_cancel_all_matching_acts_on_the_whole_filter_after_a_confirmation(
    admin_client: Client, monkeypatch
) -> None:
    monkeypatch.setattr(bulk, "BATCH", 5)  # several batches
    runs_of_two_customers()
    query = {"q": "tag:customer=42"}
    confirm = admin_client.get(url("cancel_matching"), query)
    assert confirm.status_code == 200 and confirm.context["count"] == 12
    assert WorkflowRun.objects.filter(status="canceled").count() == 0  # GET changes nothing
    done = admin_client.post(
        url("cancel_matching") + "?q=tag%3Acustomer%3D42", {"confirm": "yes", "reason": "bulk"}
    )
    assert done.status_code == 302
    canceled = WorkflowRun.objects.filter(status="canceled")
    assert canceled.count() == 12
    assert set(canceled.values_list("cancel_reason", flat=True)) == {"bulk"}
    assert WorkflowRun.objects.filter(status="pending", tags={"customer": "7"}).count() == 3
    logged = LogEntry.objects.filter(change_message="Canceled: bulk")
    assert sorted(str(i) for i in logged.values_list("object_id", flat=True)) == sorted(
        str(pk) for pk in canceled.values_list("pk", flat=True)
    )


def test_retry_all_matching(admin_client: Client, fake_clock: FakeClock) -> None:
    for _ in range(4):
        tasks_engine.enqueue("fatal")
    tasks_engine.enqueue("noop", {"n": 1})
    drain(fake_clock)
    confirm = admin_client.get(url("retry_matching"), {"status__exact": "failed"})
    assert confirm.context["count"] == 4
    admin_client.post(url("retry_matching") + "?status__exact=failed", {"confirm": "yes"})
    assert WorkflowRun.objects.filter(task_name="fatal", status="pending").count() == 4
    run = WorkflowRun.objects.filter(task_name="fatal").first()
    assert run.retries[0]["by"].startswith("admin:")


def test_without_a_filter_nothing_happens(admin_client: Client) -> None:
    runs_of_two_customers()
    response = admin_client.post(url("cancel_matching"), {"confirm": "yes"})
    assert response.status_code == 302
    assert WorkflowRun.objects.filter(status="canceled").count() == 0


@pytest.mark.parametrize("view", ["cancel_matching", "retry_matching"])
def test_staff_without_the_permission_get_403_and_nothing_changes(
    view: str, fake_clock: FakeClock
) -> None:
    runs_of_two_customers()
    tasks_engine.enqueue("fatal")
    drain(fake_clock)
    before = list(WorkflowRun.objects.order_by("pk").values_list("pk", "status", "updated_at"))
    staff = staff_client(*VIEW_ALL)
    assert staff.get(url(view), {"q": "tag:customer=42"}).status_code == 403
    posted = staff.post(url(view) + "?task__exact=noop", {"confirm": "yes"})
    assert posted.status_code == 403
    assert list(WorkflowRun.objects.order_by("pk").values_list("pk", "status", "updated_at")) == (
        before
    )
    page = staff.get(url("changelist"), {"q": "tag:customer=42"})
    assert 'id="cancel-matching"' not in page.content.decode()
    assert LogEntry.objects.count() == 0
