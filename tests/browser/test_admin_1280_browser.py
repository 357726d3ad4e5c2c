"""The admin at 1280 x 800 in a real browser, and the operator actions issue 43 asked for.

At 1280 px with the app sidebar open (Django's default), the runs list shows every column in
the window: CREATED and DURATION were cut off and WAITS ON clipped by the table's scroll box.
A 300-character step key wraps inside its card; the retry form's default option is readable.
Deliver a fact on a waiting run, and Run now on a schedule, end to end.

Screenshots go to tests/artifacts/; with ADMIN_SCREENSHOTS_TO_DOCS=1 they refresh
docs/screenshots/ (shown on docs/admin.md). Same browser and skips as test_admin_browser.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry

from tasks_engine import clock, schedules, testing
from tasks_engine.models import Fact, Schedule, WorkflowRun
from tests.browser import test_admin_browser as shared
from tests.browser.rundata import add_step, make_run, make_showcase

sync_api = shared.sync_api
expect = sync_api.expect
pytestmark = pytest.mark.django_db(transaction=True)

WIDTH, HEIGHT = 1280, 800
SCREENSHOTS = shared.DOCS / "screenshots"
RUNS_URL = "/admin/tasks_engine/workflowrun/"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from shared.browser.__wrapped__()  # type: ignore[attr-defined]


@pytest.fixture
def page(browser: Any, live_server: Any) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": WIDTH, "height": HEIGHT}, base_url=live_server.url
    )
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


def shoot(page: Any, name: str, *, full_page: bool = False) -> None:
    shared.ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = shared.ARTIFACTS / name
    page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("ADMIN_SCREENSHOTS_TO_DOCS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, SCREENSHOTS / name)


# Each cell of a column: where it is, and whether its content is wider than its box.
BOXES = """(selector) => {
  const box = document.querySelector('#changelist-form .results').getBoundingClientRect();
  return [...document.querySelectorAll(selector)].map(el => {
    const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, clip_right: box.right, clip_left: box.left,
            overflow: el.scrollWidth - el.clientWidth, text: el.innerText.slice(0, 40)};
  });
}"""


def test_every_column_of_the_runs_list_is_in_the_window_at_1280(page: Any) -> None:
    make_showcase()
    now = clock.now()
    make_run(  # what a run waits on can be long: it wraps in its cell
        "waiting",
        "acquire",
        now=now,
        created_at=now - timedelta(seconds=5),
        waiting_on="fact:download-done-for-plan-4713-of-the-library-in-the-north-wing",
        available_at=now + timedelta(days=7),
    )
    make_run(  # and so can a task name
        "completed",
        "reconcile_library_with_the_download_client_every_night",
        now=now,
        created_at=now - timedelta(seconds=50),
    )
    shared.log_in(page)
    assert page.evaluate("window.innerWidth") == WIDTH
    expect(page.locator("#nav-sidebar")).to_be_visible()  # Django's default: the sidebar open
    results = page.evaluate(
        "(() => { const r = document.querySelector('#changelist-form .results');"
        " return [r.scrollWidth, r.clientWidth]; })()"
    )
    assert results[0] <= results[1], f"the table scrolls sideways in its box: {results}"
    for column in ("waits_on", "created", "duration", "task", "status_badge", "queue"):
        cells = page.evaluate(
            BOXES, f"#result_list th.column-{column}, #result_list td.field-{column}"
        )
        assert len(cells) >= 2, column
        for cell in cells:
            assert cell["left"] >= 0 and cell["right"] <= WIDTH, (column, cell)
            assert (
                cell["clip_left"] <= cell["left"] and cell["right"] <= cell["clip_right"] + 0.5
            ), (
                column,
                cell,
            )
            assert cell["overflow"] <= 0, (column, cell)
    expect(page.locator("#due-unserved")).to_contain_text("no worker is alive")
    shoot(page, "admin-runs-1280.png")
    page.locator("#changelist-search").scroll_into_view_if_needed()
    page.evaluate("document.querySelector('#changelist-search').scrollIntoView()")
    shoot(page, "admin-runs-1280-table.png")


def test_a_long_step_name_stays_inside_its_card(page: Any) -> None:
    now = clock.now()
    run = make_run("failed", "acquire", now=now, created_at=now - timedelta(minutes=3))
    long_name = "copy-file:" + "Heat.1995.2160p.UHD.BluRay.x265-" * 9
    add_step(run, "submit-download", run.created_at + timedelta(seconds=1), 2)
    add_step(run, long_name[:300], run.created_at + timedelta(seconds=4), 30, status="failed")
    shared.log_in(page)
    page.goto(f"{RUNS_URL}{run.pk}/change/")
    expect(page.locator("#timeline tr.te-step")).to_have_count(2)
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    card = page.locator("#timeline").bounding_box()
    table = page.locator("#timeline table").bounding_box()
    assert card is not None and table is not None
    assert table["x"] + table["width"] <= card["x"] + card["width"], (table, card)
    for cell in page.evaluate(
        BOXES.replace("#changelist-form .results", "#timeline"), "td.te-stepname"
    ):
        assert cell["overflow"] <= 0 and cell["right"] <= cell["clip_right"], cell


def test_the_retry_form_s_default_option_is_not_cut(page: Any) -> None:
    with testing.WorkflowTester() as t:
        run_id = t.start("gated", {"key": "shot"})
        assert t.run_to_completion(run_id).status == "failed"
    shared.log_in(page)
    page.goto(f"{RUNS_URL}{run_id}/change/")
    page.click("#retry-open")
    select = page.locator("#retry-from-step")
    expect(select).to_be_visible()
    # The selected option's text against the room the closed select gives it (its box less
    # its padding and the arrow): measured with the select's own font.
    text, room = page.evaluate(
        """() => {
      const s = document.querySelector('#retry-from-step'), cs = getComputedStyle(s);
      const ctx = document.createElement('canvas').getContext('2d');
      ctx.font = cs.font;
      const text = ctx.measureText(s.options[s.selectedIndex].text).width;
      const arrow = 24, pad = parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight);
      return [text, s.clientWidth - pad - arrow];
    }"""
    )
    assert text <= room, (text, room)
    shoot(page, "admin-retry-form.png")


def test_deliver_a_fact_to_a_waiting_run(page: Any) -> None:
    with testing.WorkflowTester() as t:
        run_id = t.start("observe_acquire", {"plan_id": 4713})
        t.run_until_idle(jump=False)
    shared.log_in(page)
    page.goto(f"{RUNS_URL}{run_id}/change/")
    expect(page.locator("#deliver-fact-box")).to_contain_text("download-done")
    page.evaluate("window.teStopRefresh && window.teStopRefresh()")
    page.click("#deliver-fact-open")
    expect(page.locator("#fact-name")).to_have_value("download-done")
    # Not JSON: one line, the form kept as typed, nothing stored.
    page.fill("#fact-payload", "{size: 53902112768}")
    page.fill("#fact-reason", "qBittorrent's hook was down during the upgrade")
    page.click("#deliver-fact-submit")
    expect(page.locator(".messagelist .error")).to_contain_text("The payload is not valid JSON")
    expect(page.locator("#fact-payload")).to_have_value("{size: 53902112768}")
    assert not Fact.objects.exists()
    shoot(page, "admin-deliver-fact-error.png")
    page.fill("#fact-payload", '{"size": 53902112768}')
    shoot(page, "admin-deliver-fact.png")
    page.click("#deliver-fact-submit")
    page.wait_for_url(f"**/{run_id}/change/")
    expect(page.locator(".messagelist .success")).to_contain_text(
        "Fact download-done delivered to run"
    )
    expect(page.locator("#run-status")).to_have_text("pending")
    expect(page.locator("#facts")).to_contain_text("53902112768")
    page.evaluate("window.teStopRefresh && window.teStopRefresh()")
    shoot(page, "admin-deliver-fact-done.png")
    assert LogEntry.objects.get().change_message == (
        "Delivered fact download-done: qBittorrent's hook was down during the upgrade"
    )


def test_run_a_schedule_now(page: Any, settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}},
    }
    schedules.ensure_rows()
    row = Schedule.objects.get()
    shared.log_in(page)
    page.goto("/admin/tasks_engine/schedule/")
    page.click("a.te-run-now")
    page.wait_for_url(f"**/{row.pk}/run_now/")
    page.fill("#run-now-reason", "the library was restored from backup: scan it tonight, not at 3")
    shoot(page, "admin-run-now.png")
    page.click("#confirm-run-now")
    page.wait_for_url("**/admin/tasks_engine/schedule/")
    expect(page.locator(".messagelist .success")).to_contain_text("Started run")
    shoot(page, "admin-run-now-done.png")
    # The same form sent again (a double click, a resend): no second run.
    run = WorkflowRun.objects.get(task_name="repeat_names")
    form_token = run.idempotency_key.removeprefix("schedule:nightly-scan:now:")
    again = post_from_the_page(page, f"/admin/tasks_engine/schedule/{row.pk}/run_now/", form_token)
    assert again.status == 302
    page.goto("/admin/tasks_engine/schedule/")
    expect(page.locator(".messagelist .info")).to_contain_text("This form was already submitted")
    assert WorkflowRun.objects.filter(task_name="repeat_names").count() == 1


def post_from_the_page(page: Any, url: str, token: str) -> Any:
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    form = {"token": token, "reason": "sent twice"}
    return page.request.post(url, form=form, headers={"X-CSRFToken": csrf}, max_redirects=0)
