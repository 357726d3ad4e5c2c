"""Operating many runs in a real browser: the runs list's "cancel all N matching" and "retry all
N matching" on a filtered list, and the Queues page's pause and resume. Each shows its
confirmation page first; staff without the permission see no button, get 403 at the URL and at
a POST, and nothing changes.

Screenshots go to tests/artifacts/; with ADMIN_SCREENSHOTS_TO_DOCS=1 they refresh the docs'
pictures (docs/admin-cancel-matching.png, docs/admin-queue-paused.png).
Same browser and server as test_admin_browser.py (Chromium, `live_server`), same skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

import tasks_engine
from tasks_engine.models import Queue, WorkflowRun
from tasks_engine.operations import bulk
from tests.browser import test_admin_browser as shared

sync_api = shared.sync_api
expect = sync_api.expect
pytestmark = pytest.mark.django_db(transaction=True)

RUNS_URL = "/admin/tasks_engine/workflowrun/"
QUEUES_URL = RUNS_URL + "queues/"
# The list filtered by the tag search: twelve of customer 42 match, three of customer 7 do not.
TAGGED_42 = RUNS_URL + "?q=tag%3Acustomer%3D42"
MONO = "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from shared.browser.__wrapped__()  # type: ignore[attr-defined]


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    yield from shared.page.__wrapped__(browser, live_server)  # type: ignore[attr-defined]


def log_in_as(page: Any, username: str, next_url: str) -> None:
    page.goto(f"/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", shared.PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_url}")


def staff_with(*codenames: str) -> str:
    user = User.objects.create_user("clerk", password=shared.PASSWORD, is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user.username


def post_from_the_page(page: Any, url: str, form: dict[str, str]) -> Any:
    """A POST with the session and CSRF token the browser holds, as a form would send it: what
    a user without the button could still send."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(url, form=form, headers={"X-CSRFToken": token}, max_redirects=0)


def runs_of_two_customers() -> None:
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(12)], tags={"customer": "42"})
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(3)], tags={"customer": "7"})


def statuses() -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for run in WorkflowRun.objects.all():
        key = (run.tags["customer"], run.status)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_cancel_then_retry_all_matching_a_filtered_list(
    page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "BATCH", 5)  # twelve runs: three batches, as a large filter does
    runs_of_two_customers()
    User.objects.create_superuser("ops", "ops@example.com", shared.PASSWORD)
    log_in_as(page, "ops", RUNS_URL)
    page.click("#toggle-nav-sidebar")  # collapsed for the screenshot: the page, not the menu

    # The list filtered by tag: the button acts on the whole filter and says how many.
    page.goto(TAGGED_42)
    expect(page.locator("#result_list tbody tr")).to_have_count(12)
    expect(page.locator("#cancel-matching")).to_have_text("Cancel all 12 matching")
    page.click("#cancel-matching")
    page.wait_for_url("**/cancel-matching/?q=tag*")
    expect(page.locator("#matching-count")).to_have_text("12")
    expect(page.locator("#content-main")).to_contain_text("tag:customer=42")
    # The admin's breadcrumbs bar, its way back keeping the filter; the engine's styles.
    back = page.locator("ol.breadcrumbs").get_by_role("link", name="Workflow runs")
    expect(back).to_have_attribute("href", TAGGED_42)
    expect(page.locator("#content-main .te-mono").first).to_have_css("font-family", MONO)
    assert statuses() == {("42", "pending"): 12, ("7", "pending"): 3}  # showing changed nothing
    page.fill("#matching-reason", "customer 42 withdrew the batch")
    page.set_viewport_size({"width": 1280, "height": 480})
    shared.shoot(page, "admin-cancel-matching.png", full_page=False)
    page.click("#confirm-matching")
    page.wait_for_url(f"**{TAGGED_42}")
    expect(page.locator(".messagelist")).to_contain_text("Canceled 12 matching run(s).")
    assert statuses() == {("42", "canceled"): 12, ("7", "pending"): 3}
    reasons = WorkflowRun.objects.filter(tags__customer="42").values_list("cancel_reason")
    assert set(reasons) == {("customer 42 withdrew the batch",)}

    # Retry the canceled ones: the status filter and the search together.
    page.goto(TAGGED_42 + "&status__exact=canceled")
    expect(page.locator("#retry-matching")).to_have_text("Retry all 12 matching")
    page.click("#retry-matching")
    page.wait_for_url("**/retry-matching/?**")
    expect(page.locator("#matching-count")).to_have_text("12")
    page.fill("#matching-reason", "customer 42 is back")
    page.click("#confirm-matching")
    page.wait_for_url("**/workflowrun/?**")
    expect(page.locator(".messagelist")).to_contain_text("Retried 12 matching run(s).")
    assert statuses() == {("42", "pending"): 12, ("7", "pending"): 3}
    retried = WorkflowRun.objects.filter(tags__customer="42")
    assert {(r.retries[-1]["by"], r.retries[-1]["reason"]) for r in retried} == {
        ("admin:ops", "customer 42 is back")
    }


@pytest.mark.parametrize(
    ("granted", "refused"),
    [
        (("view_workflowrun",), ("cancel-matching", "retry-matching")),
        (("view_workflowrun", "cancel_workflowrun"), ("retry-matching",)),
    ],
    ids=["view-only", "cancel-but-not-retry"],
)
def test_staff_without_the_permission_get_403_and_nothing_changes(
    page: Any, granted: tuple[str, ...], refused: tuple[str, ...]
) -> None:
    runs_of_two_customers()
    WorkflowRun.objects.filter(tags__customer="7").update(status="failed")
    before = statuses()
    log_in_as(page, staff_with(*granted), RUNS_URL)
    page.goto(TAGGED_42)
    expect(page.locator("#result_list tbody tr")).to_have_count(12)
    if "cancel-matching" not in refused:  # granted: the button is there
        expect(page.locator("#cancel-matching")).to_have_text("Cancel all 12 matching")
    for view in refused:
        expect(page.locator(f"#{view}")).to_have_count(0)  # no button
    for view in refused:
        for query in ("q=tag%3Acustomer%3D42", "q=tag%3Acustomer%3D7"):
            shown = page.goto(f"{RUNS_URL}{view}/?{query}")
            assert shown is not None and shown.status == 403
            sent = post_from_the_page(
                page, f"{RUNS_URL}{view}/?{query}", {"confirm": "yes", "reason": "sneak"}
            )
            assert sent.status == 403, sent.text()[:200]
            assert "CSRF" not in sent.text()  # refused for the permission, not the token
    assert statuses() == before
    assert not WorkflowRun.objects.filter(cancel_reason="sneak").exists()


def test_pause_and_resume_a_queue_from_the_queues_page(page: Any) -> None:
    for i in range(3):
        tasks_engine.enqueue("noop", {"n": i})
    User.objects.create_superuser("ops", "ops@example.com", shared.PASSWORD)
    log_in_as(page, "ops", RUNS_URL)
    page.click("#toggle-nav-sidebar")
    page.goto(QUEUES_URL)
    row = page.locator('#te-queues tr[data-queue="default"]')
    expect(row).to_contain_text("active")
    row.get_by_role("link", name="Pause").click()
    page.wait_for_url("**/queues/default/pause/")
    expect(page.locator("#content")).to_contain_text("No worker claims its pending runs")
    assert not Queue.objects.filter(paused=True).exists()  # showing changed nothing
    page.fill("#queue-reason", "the NAS is offline")
    page.click("#confirm-pause")
    page.wait_for_url(f"**{QUEUES_URL}")
    expect(page.locator(".messagelist")).to_contain_text("Paused default.")
    expect(row.locator(".te-badge")).to_have_text("paused")
    expect(row).to_contain_text("the NAS is offline")
    expect(row.get_by_role("link", name="Resume")).to_be_visible()
    assert Queue.objects.get(name="default").paused
    assert Queue.objects.get(name="default").reason == "the NAS is offline"
    assert [q.paused for q in tasks_engine.list_queues() if q.name == "default"] == [True]
    page.set_viewport_size({"width": 1280, "height": 480})
    shared.shoot(page, "admin-queue-paused.png", full_page=False)

    row.get_by_role("link", name="Resume").click()
    page.wait_for_url("**/queues/default/resume/")
    page.click("#confirm-resume")
    page.wait_for_url(f"**{QUEUES_URL}")
    expect(page.locator(".messagelist")).to_contain_text("Resumed default.")
    expect(row.locator(".te-badge")).to_have_text("active")
    assert not Queue.objects.get(name="default").paused


def test_staff_without_pause_queue_get_403_and_the_queue_stays_as_it_was(page: Any) -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    tasks_engine.pause_queue("default", reason="kept paused")
    log_in_as(page, staff_with("view_workflowrun", "change_queue"), RUNS_URL)
    page.goto(QUEUES_URL)
    row = page.locator('#te-queues tr[data-queue="default"]')
    expect(row.locator(".te-badge")).to_have_text("paused")
    expect(row.get_by_role("link", name="Resume")).to_have_count(0)
    expect(row.get_by_role("link", name="Limits")).to_be_visible()  # the one they may use
    for op in ("resume", "pause"):
        shown = page.goto(f"{QUEUES_URL}default/{op}/")
        assert shown is not None and shown.status == 403
        page.goto(QUEUES_URL)
        sent = post_from_the_page(page, f"{QUEUES_URL}default/{op}/", {"reason": "sneak"})
        assert sent.status == 403, sent.text()[:200]
        assert "CSRF" not in sent.text()
    state = Queue.objects.get(name="default")
    assert (state.paused, state.reason) == (True, "kept paused")
