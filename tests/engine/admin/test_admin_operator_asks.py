"""What operators asked of the admin (issue 43, item 7), in process: search by task name, the
cancel banner and the output of finished runs said plainly, the red banner when due runs have
no live worker, and the two new actions, each behind its own permission, audited, idempotent
against a double submit, with a one-line error and nothing written for bad input: "Deliver a
fact" on a run waiting on one, and "Run now" on a schedule."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine import schedules, testing
from tasks_engine.models import Fact, Schedule, WorkflowRun
from tests.browser.rundata import make_run, make_showcase
from tests.engine.admin.test_admin import VIEW_ALL, staff_client
from tests.engine.admin.test_admin_lists import shown_ids
from tests.engine.admin.test_workers_admin import live_worker
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

RUNS = reverse("admin:tasks_engine_workflowrun_changelist")


def run_url(run_id: Any, view: str = "change") -> str:
    return reverse(f"admin:tasks_engine_workflowrun_{view}", args=[run_id])


def said(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def token_in(page: str) -> str:
    found = re.search(r'name="token" value="([0-9a-f]{32})"', page)
    assert found, "no form token on the page"
    return found.group(1)


def of_task(name: str) -> set[str]:
    found = WorkflowRun.objects.filter(task_name=name).values_list("pk", flat=True)
    return {str(pk) for pk in found}


# -- search -------------------------------------------------------------------------------------


def test_search_finds_runs_by_task_name_and_still_by_id_prefix(admin_client: Client) -> None:
    runs = make_showcase()
    acquires = of_task("acquire")

    def ids(term: str) -> set[str]:
        return set(shown_ids(admin_client.get(RUNS, {"q": term}).content))

    assert len(acquires) == 4
    assert ids("acquire") == acquires
    assert ids("acquire@1") == acquires  # as the list shows a run's task
    assert ids("acquire@2") == set()
    assert ids(" probe_media ") == of_task("probe_media")
    target = runs["acquire"]
    assert ids(str(target.pk)[-8:]) == {str(target.pk)}  # the characters the list shows
    assert str(target.pk) in ids(str(target.pk)[:8])  # the first ones: its 65-second window
    assert ids(str(target.pk)) == {str(target.pk)}
    assert ids("plan:4711") == {str(target.pk)}  # an idempotency key
    assert ids("acquir") == set()  # exact, as every term


# -- the run page says what happened ------------------------------------------------------------


def test_after_a_cancel_the_page_says_canceled_not_cancel_requested(admin_client: Client) -> None:
    waiting = make_run("waiting", waiting_on="fact:go")
    response = admin_client.post(run_url(waiting.pk, "cancel"), {"reason": "not wanted"})
    assert said(response) == [f"Run {waiting.pk} canceled."]
    page = admin_client.get(run_url(waiting.pk)).content.decode()
    info = re.search(r'<div class="te-canceled-note" id="cancel-info">(.*?)</div>', page, re.S)
    assert info is not None
    assert "<strong>Canceled</strong>" in info.group(1)
    assert "Cancel requested" not in info.group(1)
    assert "not wanted" in info.group(1)


def test_a_running_run_s_cancel_is_requested_until_its_worker_stops_it(
    admin_client: Client,
) -> None:
    running = make_run("running")
    response = admin_client.post(run_url(running.pk, "cancel"), {"reason": "stop"})
    assert said(response) == [
        f"Cancel requested for run {running.pk}: its worker stops it at its next heartbeat."
    ]
    page = admin_client.get(run_url(running.pk)).content.decode()
    assert "<strong>Cancel requested</strong>" in page and "not stopped yet" in page


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        ("completed", "None: the workflow returned nothing."),
        ("failed", "None: the run failed before it returned a value."),
        ("canceled", "None: the run canceled before it returned a value."),
        ("waiting", "None yet."),
    ],
)
def test_a_finished_run_without_output_does_not_say_none_yet(
    admin_client: Client, status: str, shown: str
) -> None:
    run = make_run(status, output=None)
    page = admin_client.get(run_url(run.pk)).content.decode()
    output = re.search(r'<section class="te-card" id="output">(.*?)</section>', page, re.S)
    assert output is not None and shown in output.group(1)


# -- due runs no live worker serves --------------------------------------------------------------


def test_the_runs_list_has_a_red_banner_when_due_runs_have_no_live_worker() -> None:
    viewer = staff_client(*VIEW_ALL)  # seeing runs is enough to see why they do not move
    run = tasks_engine.enqueue("noop").run_id
    page = viewer.get(RUNS).content.decode()
    assert 'id="due-unserved"' in page
    assert "1 due pending run(s) of noop@1 in queue &#x27;default&#x27;: no worker is alive" in page
    live_worker("repeat_names")  # alive, but serves another task
    page = viewer.get(RUNS).content.decode()
    assert "of noop@1 in queue &#x27;default&#x27;: no live worker serves it" in page
    live_worker("noop")  # now one serves it: no banner
    assert 'id="due-unserved"' not in viewer.get(RUNS).content.decode()
    WorkflowRun.objects.filter(pk=run).delete()


def test_no_banner_for_runs_not_due_yet(admin_client: Client) -> None:
    make_run("waiting", waiting_on="fact:go")  # not due: waits on a fact
    assert 'id="due-unserved"' not in admin_client.get(RUNS).content.decode()


# -- deliver a fact -------------------------------------------------------------------------------


@pytest.fixture
def waiting_run() -> Any:
    with testing.WorkflowTester() as t:
        run_id = t.start("observe_acquire", {"plan_id": 7})
        t.run_until_idle(jump=False)
        assert t.get_run(run_id).status == "waiting"
    return run_id


def deliverer() -> Client:
    return staff_client(*VIEW_ALL, "deliver_fact_workflowrun")


def test_deliver_a_fact_needs_its_permission(waiting_run: Any) -> None:
    viewer = staff_client(*VIEW_ALL, "cancel_workflowrun", "retry_workflowrun")
    page = viewer.get(run_url(waiting_run)).content.decode()
    assert 'id="deliver-fact-open"' not in page
    assert viewer.get(run_url(waiting_run, "deliver_fact")).status_code == 403
    form = {"name": "download-done", "payload": "{}", "token": "a" * 32}
    assert viewer.post(run_url(waiting_run, "deliver_fact"), form).status_code == 403
    assert not Fact.objects.exists() and not LogEntry.objects.exists()


def test_deliver_a_fact_wakes_the_run_once_and_is_audited(waiting_run: Any) -> None:
    client = deliverer()
    page = client.get(run_url(waiting_run)).content.decode()
    assert f'href="{run_url(waiting_run, "deliver_fact")}"' in page
    form_page = client.get(run_url(waiting_run, "deliver_fact")).content.decode()
    assert 'value="download-done"' in form_page  # the name it waits on, filled in
    form = {
        "name": "download-done",
        "payload": '{"size": 42}',
        "reason": "qBittorrent's hook was down",
        "token": token_in(form_page),
    }
    first = client.post(run_url(waiting_run, "deliver_fact"), form, follow=True)
    assert first.redirect_chain == [(run_url(waiting_run), 302)]
    assert said(first) == [
        f"Fact download-done delivered to run {waiting_run}; the run is pending now."
    ]
    again = client.post(run_url(waiting_run, "deliver_fact"), form, follow=True)  # twice
    assert said(again) == [
        "This form was already submitted: fact download-done was delivered once."
    ]
    assert list(Fact.objects.values_list("name", "payload")) == [("download-done", {"size": 42})]
    entry = LogEntry.objects.get()
    assert entry.object_id == str(waiting_run)
    assert entry.change_message == "Delivered fact download-done: qBittorrent's hook was down"
    with testing.WorkflowTester() as t:
        done = t.run_to_completion(waiting_run)
    assert (done.status, done.output) == ("completed", {"ok": True, "size": 42})


@pytest.mark.parametrize(
    ("form", "error"),
    [
        (
            {"name": "download-done", "payload": "{size: 42}"},
            "The payload is not valid JSON (Expecting property name enclosed in double quotes:"
            " line 1 column 2 (char 1)); nothing delivered.",
        ),
        ({"name": "", "payload": "{}"}, "The fact's name is empty; nothing delivered."),
        (
            {"name": "x" * 201, "payload": "{}"},
            "fact name is 201 characters long: at most 200; nothing delivered.",
        ),
        (
            {"name": "download-done", "payload": "1", "reason": "r" * 2001},
            "The reason is 2001 characters long: at most 2000; nothing delivered.",
        ),
        (
            {"name": "download-done", "payload": "1", "token": "stale"},
            "This form is out of date (no valid form token): open it again; nothing delivered.",
        ),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(
    waiting_run: Any, form: dict[str, str], error: str
) -> None:
    client = deliverer()
    response = client.post(run_url(waiting_run, "deliver_fact"), {"token": "b" * 32, **form})
    assert response.status_code == 200  # the form again, as typed
    messages = said(response)
    assert len(messages) == 1 and "\n" not in messages[0]
    assert messages[0].endswith(error) if form["name"].startswith("x") else messages == [error]
    assert form["payload"] in response.content.decode()
    assert not Fact.objects.exists() and not LogEntry.objects.exists()
    assert WorkflowRun.objects.get(pk=waiting_run).status == "waiting"


def test_no_fact_for_a_finished_run(admin_client: Client) -> None:
    done = make_run("completed")
    response = admin_client.post(
        run_url(done.pk, "deliver_fact"), {"name": "go", "payload": "1", "token": "c" * 32}
    )
    assert said(response) == [f"Run {done.pk} has completed: no fact can be delivered."]
    assert not Fact.objects.exists() and not LogEntry.objects.exists()


# -- run a schedule now ------------------------------------------------------------------------


@pytest.fixture
def nightly(settings: Any, fake_clock: FakeClock) -> Schedule:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}},
    }
    fake_clock.current = datetime(2026, 12, 1, 12, tzinfo=UTC)
    schedules.ensure_rows()
    return Schedule.objects.get()


def schedule_url(view: str, *args: Any) -> str:
    return reverse(f"admin:tasks_engine_schedule_{view}", args=args)


def test_run_now_needs_its_permission(nightly: Schedule) -> None:
    pauser = staff_client("view_schedule", "pause_schedule")
    assert (
        schedule_url("run_now", nightly.pk)
        not in pauser.get(schedule_url("changelist")).content.decode()
    )
    assert pauser.get(schedule_url("run_now", nightly.pk)).status_code == 403
    form = {"token": "d" * 32, "reason": "now"}
    assert pauser.post(schedule_url("run_now", nightly.pk), form).status_code == 403
    assert not WorkflowRun.objects.exists() and not LogEntry.objects.exists()


def test_run_now_starts_one_run_per_form_and_is_audited(nightly: Schedule) -> None:
    runner = staff_client("view_schedule", "run_now_schedule")
    listing = runner.get(schedule_url("changelist")).content.decode()
    assert schedule_url("run_now", nightly.pk) in listing
    assert schedule_url("pause", nightly.pk) not in listing  # only the buttons it may use
    assert (
        schedule_url("run_now", nightly.pk)
        in runner.get(schedule_url("change", nightly.pk)).content.decode()
    )
    form_page = runner.get(schedule_url("run_now", nightly.pk)).content.decode()
    form = {"token": token_in(form_page), "reason": "the library changed"}
    first = runner.post(schedule_url("run_now", nightly.pk), form, follow=True)
    run = WorkflowRun.objects.get()
    assert (run.task_name, run.idempotency_key) == (
        "repeat_names",
        f"schedule:nightly-scan:now:{form['token']}",
    )
    assert said(first) == [
        f'Started run <a href="{run_url(run.pk)}">{run.pk}</a> of schedule nightly-scan.'
    ]
    again = runner.post(schedule_url("run_now", nightly.pk), form, follow=True)  # twice
    assert said(again) == [
        f'This form was already submitted: it started run <a href="{run_url(run.pk)}">{run.pk}</a>.'
    ]
    assert WorkflowRun.objects.count() == 1
    logged = sorted(LogEntry.objects.values_list("object_id", "change_message"))
    assert logged == sorted(
        [
            (str(nightly.pk), f"Ran now: run {run.pk}: the library changed"),
            (str(run.pk), "Started by Run now of schedule nightly-scan: the library changed"),
        ]
    )
    # A second form (a new click) starts a second run; the cron slots are left as they were.
    second = {"token": token_in(runner.get(schedule_url("run_now", nightly.pk)).content.decode())}
    runner.post(schedule_url("run_now", nightly.pk), second)
    assert WorkflowRun.objects.count() == 2
    row = Schedule.objects.get()
    assert (row.next_fire_at, row.last_slot_at) == (nightly.next_fire_at, nightly.last_slot_at)


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"token": "nope"}, "This form is out of date (no form token); open it again."),
        (
            {"token": "e" * 32, "reason": "r" * 2001},
            "The reason is 2001 characters long: at most 2000; nothing started.",
        ),
    ],
)
def test_run_now_bad_input_is_one_line_and_nothing_is_written(
    nightly: Schedule, form: dict[str, str], error: str
) -> None:
    runner = staff_client("view_schedule", "run_now_schedule")
    response = runner.post(schedule_url("run_now", nightly.pk), form)
    assert said(response) == [error]
    assert not WorkflowRun.objects.exists() and not LogEntry.objects.exists()


def test_run_now_of_a_schedule_no_longer_defined_starts_nothing(
    settings: Any, nightly: Schedule
) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "SCHEDULES": {}}  # removed since the page
    runner = staff_client("view_schedule", "run_now_schedule")
    response = runner.post(schedule_url("run_now", nightly.pk), {"token": "f" * 32})
    assert said(response) == ["nightly-scan is no longer defined; nothing started."]
    assert not WorkflowRun.objects.exists() and not LogEntry.objects.exists()
