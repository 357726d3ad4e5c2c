"""The admin in a real browser: Playwright driving Debian's Chromium against `live_server`.

Log in, open the runs list, filter by status, open a run, see its timeline and progress bar,
cancel it with a reason, see it canceled; and cancel from the list with the action.
Screenshots go to tests/artifacts/; with ADMIN_SCREENSHOTS_TO_DOCS=1 the two README pictures
(docs/admin-runs.png, docs/admin-run.png) are refreshed too.
Skips when Chromium (`apt-get install chromium`) or the `playwright` package is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tasks_engine import clock, testing
from tasks_engine.admin import audit
from tasks_engine.admin.operator_actions import MAX_REASON
from tasks_engine.models import WorkflowRun
from tests.browser.rundata import make_run, make_showcase
from tests.testapp.models import Marker

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    if os.environ.get("CI"):  # CI never skips a browser test
        raise RuntimeError(f"CI: {CHROMIUM} is missing (scripts/install-system-deps)")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is missing (pip install playwright)"
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
DOCS = ROOT / "docs"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Playwright's sync API keeps an event loop running in this thread; the test's own ORM
    # calls would otherwise be refused as "called from an async context".
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


def log_in(page: Any) -> None:
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    page.goto("/admin/login/?next=/admin/tasks_engine/workflowrun/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/tasks_engine/workflowrun/")


def shoot(page: Any, name: str, *, full_page: bool) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("ADMIN_SCREENSHOTS_TO_DOCS") == "1":
        shutil.copyfile(path, DOCS / name)


def test_filter_open_inspect_and_cancel_a_run(page: Any) -> None:
    runs = make_showcase()
    log_in(page)
    expect = sync_api.expect

    # The list: strip, charts and badges; collapse the app sidebar for a wider table.
    page.click("#toggle-nav-sidebar")
    expect(page.locator(".te-strip")).to_be_visible()
    chart = 'svg[aria-label="Finished runs per minute over the last hour"]'
    expect(page.locator(chart)).to_be_visible()
    expect(page.locator("#result_list .te-badge.te-running")).to_have_count(1)
    page.set_viewport_size({"width": 1440, "height": 1280})
    page.evaluate("window.scrollTo(0, 0)")
    shoot(page, "admin-runs.png", full_page=False)

    # Filter by status from the sidebar.
    page.locator("#changelist-filter").get_by_role("link", name="Waiting", exact=True).click()
    page.wait_for_url("**status__exact=waiting**")
    badges = page.locator("#result_list .te-badge")
    expect(badges).to_have_count(2)
    assert set(badges.all_inner_texts()) == {"waiting"}

    # Open the run waiting on its download: timeline and progress bar.
    target = runs["waiting"]
    page.locator(f'#result_list tr:has(span[title="{target.pk}"]) a').first.click()
    page.wait_for_url(f"**/{target.pk}/change/**")
    expect(page.locator("#run-status")).to_have_text("waiting")
    expect(page.locator("#timeline tr.te-step")).to_have_count(2)
    expect(page.locator("#waits-on")).to_contain_text("fact:download-done")
    progress = page.locator('#progress [role="progressbar"]')
    expect(progress).to_have_attribute("aria-valuenow", "20.0")
    expect(page.locator("#te-refresh")).to_be_visible()  # live while active

    # Cancel it with a reason.
    page.click("#cancel-open")
    page.fill("#cancel-reason", "download no longer wanted")
    page.click("#cancel-submit")
    page.wait_for_url(f"**/{target.pk}/change/**")
    expect(page.locator("#run-status")).to_have_text("canceled")
    expect(page.locator("#cancel-reason-shown")).to_have_text("download no longer wanted")
    expect(page.locator("#cancel-form")).to_have_count(0)
    expect(page.locator("#te-refresh")).to_have_count(0)
    target.refresh_from_db()
    assert (target.status, target.cancel_reason) == ("canceled", "download no longer wanted")

    # The richest page for the README: an acquisition in flight.
    page.goto(f"/admin/tasks_engine/workflowrun/{runs['acquire'].pk}/change/")
    expect(page.locator("#timeline tr.te-step")).to_have_count(5)
    expect(progress).to_have_attribute("aria-valuenow", "62.5")
    page.evaluate("window.teStopRefresh()")  # hold the live page still for the screenshot
    shoot(page, "admin-run.png", full_page=True)


def test_cancel_selected_from_the_list(page: Any) -> None:
    runs = make_showcase()
    log_in(page)
    pending = runs["pending"]
    page.goto("/admin/tasks_engine/workflowrun/?status__exact=pending")
    page.check(f'input[name="_selected_action"][value="{pending.pk}"]')
    page.select_option('select[name="action"]', "cancel_selected")
    page.click('button[name="index"], .actions button[type="submit"]')
    page.fill("#cancel-reason", "queue flush")
    page.click("#confirm-cancel")
    page.wait_for_url("**/admin/tasks_engine/workflowrun/**")
    sync_api.expect(page.locator(".messagelist")).to_contain_text("Canceled 1 run(s).")
    assert WorkflowRun.objects.get(pk=pending.pk).cancel_reason == "queue flush"
    assert WorkflowRun.objects.get(pk=pending.pk).status == "canceled"


def test_retry_a_failed_run_from_a_step(page: Any) -> None:
    """The operator's recovery: a failed run retried from its first step with a reason; the
    page then shows the retry (who, why, from where) and the superseded attempts."""
    with testing.WorkflowTester() as t:
        run_id = t.start("gated", {"key": "shot"})
        assert t.run_to_completion(run_id).status == "failed"
    log_in(page)
    expect = sync_api.expect
    page.goto(f"/admin/tasks_engine/workflowrun/{run_id}/change/")
    expect(page.locator("#run-status")).to_have_text("failed")
    Marker.objects.create(key="shot:open")  # the operator fixed what made step b fail
    page.click("#retry-open")
    page.select_option("#retry-from-step", "a")
    page.fill("#retry-reason", "NAS replaced; copy again from the start")
    page.click("#retry-submit")
    page.wait_for_url(f"**/{run_id}/change/**")
    expect(page.locator("#run-status")).to_have_text("pending")
    with testing.WorkflowTester() as t:
        assert t.run_to_completion(run_id).status == "completed"
    page.reload()
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#retries")).to_contain_text("NAS replaced; copy again from the start")
    expect(page.locator("#retries")).to_contain_text("ops")
    expect(page.locator("#timeline .te-superseded-note")).to_have_count(2)  # a and b, pass 1
    page.evaluate("window.teStopRefresh && window.teStopRefresh()")
    shoot(page, "admin-run-retried.png", full_page=True)


def test_a_long_reason_without_spaces_stays_inside_the_viewport(page: Any) -> None:
    """2,000 characters without a space (the longest reason the admin takes), as the cancel
    reason, a retry's reason and the error message, and a 300-character step key (the longest
    there is) as the retry's from step: wrapped, so the run page is no wider than the window
    (it was over 18,000 pixels wide: one unbreakable line); and so is the run's history page, where
    the admin log shows the reason too."""
    now = clock.now()
    long = "x" * MAX_REASON
    run = make_run(
        "canceled",
        cancel_requested_at=now,
        cancel_reason=f"cancel-{long}"[:MAX_REASON],
        finished_at=now,
        error={"type": "OSError", "message": f"/library/{long}"},
        retries=[{"at": now.isoformat(), "by": "ops", "reason": long, "from_step": "s" * 300}],
    )
    log_in(page)
    audit.record(User.objects.get(username="ops"), [run], "Canceled", long)
    for width in (1440, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"/admin/tasks_engine/workflowrun/{run.pk}/change/")
        sync_api.expect(page.locator("#cancel-reason-shown")).to_contain_text("cancel-xxx")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        for selector in ("#cancel-info", "#retries", ".te-retry-reason", "#run-error"):
            box = page.locator(selector).first.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, (
                selector,
                box,
                width,
            )
        # The run's history page (Django's) shows the reason an admin log entry holds.
        page.goto(f"/admin/tasks_engine/workflowrun/{run.pk}/history/")
        sync_api.expect(page.locator("#change-history")).to_contain_text("Canceled: xxx")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
