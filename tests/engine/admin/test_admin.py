"""Admin permission rules: read-only for everyone, cancel only with tasks_engine.cancel_workflowrun.

Every refusal is checked twice: the status code, and that no row changed.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine import engine
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tests.browser.rundata import add_step, make_run

pytestmark = pytest.mark.django_db

MODELS = ("workflowrun", "stepattempt", "fact", "opledger")


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    cache.clear()


def staff_client(*perms: str) -> Client:
    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:6]}", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


VIEW_ALL = tuple(f"view_{m}" for m in MODELS)

# Django's message for an unknown object (its change and history views), with its own quotes.
GONE = "{} with ID \u201c{}\u201d doesn\u2019t exist. Perhaps it was deleted?"


@pytest.fixture
def staff() -> Client:
    """Staff who may view every engine model but not cancel."""
    return staff_client(*VIEW_ALL)


@pytest.fixture
def canceller() -> Client:
    return staff_client(*VIEW_ALL, "cancel_workflowrun")


@pytest.fixture
def rows() -> dict[str, Any]:
    run = make_run("waiting", waiting_on="fact:download-done")
    step = add_step(run, "first", run.created_at, 1.0)
    fact = Fact.objects.create(
        run=run, name="download-done", payload={"ok": 1}, created_at=run.created_at
    )
    op = OpLedger.objects.create(
        op_key="op:1",
        run=run,
        attempt_token=uuid.uuid4(),
        status="done",
        created_at=run.created_at,
        updated_at=run.created_at,
    )
    return {"workflowrun": run, "stepattempt": step, "fact": fact, "opledger": op}


def snapshot() -> list[tuple]:
    return [
        tuple(
            WorkflowRun.objects.order_by("pk").values_list(
                "pk", "status", "cancel_requested_at", "cancel_reason", "updated_at"
            )
        ),
        tuple(StepAttempt.objects.order_by("pk").values_list("pk", "status", "name")),
        tuple(Fact.objects.order_by("pk").values_list("pk", "name", "payload")),
        tuple(OpLedger.objects.order_by("pk").values_list("pk", "op_key", "status")),
    ]


def url(model: str, view: str, *args: Any) -> str:
    return reverse(f"admin:tasks_engine_{model}_{view}", args=args)


# -- read-only for everyone -------------------------------------------------------------------


@pytest.mark.parametrize("who", ["superuser", "staff"])
@pytest.mark.parametrize("model", MODELS)
def test_add_change_delete_are_refused(
    who: str, model: str, rows: dict[str, Any], admin_client: Client, staff: Client
) -> None:
    client = admin_client if who == "superuser" else staff
    obj = rows[model]
    before = snapshot()
    assert client.get(url(model, "add")).status_code == 403
    assert client.post(url(model, "add"), {"name": "x", "status": "done"}).status_code == 403
    assert client.get(url(model, "delete", obj.pk)).status_code == 403
    assert client.post(url(model, "delete", obj.pk), {"post": "yes"}).status_code == 403
    changed = {"status": "completed", "name": "renamed", "op_key": "op:2", "_save": "Save"}
    assert client.post(url(model, "change", obj.pk), changed).status_code == 403
    # The GET change view is the read-only page.
    page = client.get(url(model, "change", obj.pk))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert snapshot() == before


@pytest.mark.parametrize("model", MODELS)
def test_lists_offer_no_add_and_no_delete_action(model: str, rows: dict, admin_client: Client):
    page = admin_client.get(url(model, "changelist"))
    assert page.status_code == 200
    assert url(model, "add").encode() not in page.content
    assert b"delete_selected" not in page.content


def test_delete_selected_action_is_refused(rows: dict, admin_client: Client) -> None:
    before = snapshot()
    admin_client.post(
        url("workflowrun", "changelist"),
        {
            "action": "delete_selected",
            "_selected_action": [str(rows["workflowrun"].pk)],
            "post": "yes",
        },
    )
    assert snapshot() == before


def test_history_page_sits_beside_the_run_page(rows: dict, admin_client: Client) -> None:
    run = rows["workflowrun"]
    assert admin_client.get(url("workflowrun", "history", run.pk)).status_code == 200
    assert (
        url("workflowrun", "history", run.pk).encode()
        in admin_client.get(url("workflowrun", "change", run.pk)).content
    )


def test_staff_without_view_permission_sees_nothing(rows: dict) -> None:
    client = staff_client()
    run = rows["workflowrun"]
    assert client.get(url("workflowrun", "changelist")).status_code == 403
    assert client.get(url("workflowrun", "change", run.pk)).status_code == 403


# -- cancel from the run page -----------------------------------------------------------------


def test_superuser_cancels_a_waiting_run_with_a_reason(admin_client: Client) -> None:
    run = make_run("waiting", waiting_on="sleep:nap")
    page = admin_client.get(url("workflowrun", "change", run.pk))
    assert b'id="cancel-form"' in page.content
    assert url("workflowrun", "cancel", run.pk).encode() in page.content
    response = admin_client.post(url("workflowrun", "cancel", run.pk), {"reason": "not needed"})
    assert response.status_code == 302
    assert response["Location"] == url("workflowrun", "change", run.pk)
    run.refresh_from_db()
    assert (run.status, run.cancel_reason) == ("canceled", "not needed")
    page = admin_client.get(url("workflowrun", "change", run.pk))
    assert b"not needed" in page.content
    assert b'id="cancel-form"' not in page.content  # finished: nothing left to cancel


def test_cancel_url_get_shows_a_confirmation_form(admin_client: Client) -> None:
    run = make_run("pending")
    page = admin_client.get(url("workflowrun", "cancel", run.pk))
    assert page.status_code == 200
    assert b'name="reason"' in page.content and b"csrfmiddlewaretoken" in page.content
    run.refresh_from_db()
    assert run.status == "pending"


def test_staff_without_permission_gets_403_and_no_button(staff: Client) -> None:
    run = make_run("pending")
    before = snapshot()
    page = staff.get(url("workflowrun", "change", run.pk))
    assert page.status_code == 200
    assert b'id="cancel-form"' not in page.content
    assert staff.get(url("workflowrun", "cancel", run.pk)).status_code == 403
    assert staff.post(url("workflowrun", "cancel", run.pk), {"reason": "x"}).status_code == 403
    assert snapshot() == before


def test_staff_with_permission_may_cancel(canceller: Client) -> None:
    run = make_run("pending")
    page = canceller.get(url("workflowrun", "change", run.pk))
    assert b'id="cancel-form"' in page.content
    canceller.post(url("workflowrun", "cancel", run.pk), {"reason": "by staff"})
    run.refresh_from_db()
    assert (run.status, run.cancel_reason) == ("canceled", "by staff")


def test_cancel_permission_without_view_permission_gets_403() -> None:
    """Cancel acts on runs the user may see: the cancel permission alone is not enough."""
    others = tuple(f"view_{m}" for m in MODELS if m != "workflowrun")
    blind = staff_client(*others, "cancel_workflowrun")
    pending, waiting = make_run("pending"), make_run("waiting", waiting_on="sleep:nap")
    before = snapshot()
    assert blind.get(url("workflowrun", "change", pending.pk)).status_code == 403
    assert blind.get(url("workflowrun", "cancel", pending.pk)).status_code == 403
    for run in (pending, waiting):
        response = blind.post(url("workflowrun", "cancel", run.pk), {"reason": "blind"})
        assert response.status_code == 403
    assert action(blind, [pending.pk, waiting.pk]).status_code == 403
    assert action(blind, [pending.pk, waiting.pk], confirm="yes", reason="x").status_code == 403
    assert snapshot() == before


def test_cancel_needs_csrf() -> None:
    user = User.objects.create_superuser("root", "r@example.com", "pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    run = make_run("pending")
    assert client.post(url("workflowrun", "cancel", run.pk), {"reason": "x"}).status_code == 403
    run.refresh_from_db()
    assert run.status == "pending"


def test_cancel_of_a_running_run_is_requested_and_shown(admin_client: Client) -> None:
    run = make_run("running")
    admin_client.post(url("workflowrun", "cancel", run.pk), {"reason": "stop it"})
    run.refresh_from_db()
    assert run.status == "running" and run.cancel_requested_at is not None
    page = admin_client.get(url("workflowrun", "change", run.pk)).content
    assert b"cancel requested" in page and b"stop it" in page
    assert b'id="cancel-form"' not in page


def test_cancel_of_a_finished_run_changes_nothing(admin_client: Client) -> None:
    run = make_run("completed")
    before = snapshot()
    response = admin_client.post(
        url("workflowrun", "cancel", run.pk), {"reason": "late"}, follow=True
    )
    assert b"already finished" in response.content
    assert snapshot() == before


@pytest.mark.parametrize(
    ("op", "method"),
    [("cancel", "get"), ("cancel", "post"), ("retry", "get"), ("retry", "post"), ("change", "get")],
)
@pytest.mark.parametrize("run_id", [str(uuid.uuid4()), "not-a-uuid"])
def test_an_unknown_run_is_answered_as_django_answers_an_unknown_object(
    admin_client: Client, op: str, method: str, run_id: str
) -> None:
    """As Django's own change and history views: a warning naming the id, and a redirect (to
    the runs list); before, cancel/ and retry/ answered a bare 404."""
    before = snapshot()
    response = getattr(admin_client, method)(url("workflowrun", op, run_id), follow=True)
    assert response.redirect_chain == [(url("workflowrun", "changelist"), 302)]
    assert response.status_code == 200
    text = response.content.decode()
    assert GONE.format("Workflow run", run_id) in text
    assert snapshot() == before


def test_a_run_pruned_before_the_cancel_is_posted_is_answered_alike(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run("pending")

    def pruned(run_id: Any, reason: Any = None) -> bool:
        raise tasks_engine.UnknownRunError(f"no run with id {run_id}")

    monkeypatch.setattr(engine, "cancel", pruned)
    response = admin_client.post(url("workflowrun", "cancel", run.pk), {"reason": "x"})
    assert (response.status_code, response["Location"]) == (302, url("workflowrun", "changelist"))
    page = admin_client.get(response["Location"]).content.decode()
    assert GONE.format("Workflow run", run.pk) in page


def test_an_unknown_run_is_403_for_staff_without_the_permission(staff: Client) -> None:
    """The permission is checked first: an unknown id tells staff without it nothing."""
    for op in ("cancel", "retry"):
        assert staff.post(url("workflowrun", op, uuid.uuid4())).status_code == 403


def test_cancel_goes_through_the_engine(admin_client: Client, monkeypatch) -> None:
    calls = []
    real = engine.cancel

    def spy(rid: Any, reason: str | None = None) -> bool:
        calls.append((rid, reason))
        return real(rid, reason)

    monkeypatch.setattr(engine, "cancel", spy)
    run = make_run("pending")
    admin_client.post(url("workflowrun", "cancel", run.pk), {"reason": "spy"})
    assert calls == [(run.pk, "spy")]


def test_canceling_a_parent_cancels_its_children(admin_client: Client) -> None:
    parent = make_run("waiting", waiting_on=f"child:{uuid.uuid4()}")
    child = make_run("pending", parent_run=parent)
    admin_client.post(url("workflowrun", "cancel", parent.pk), {"reason": "whole tree"})
    child.refresh_from_db()
    assert child.status == "canceled"


# -- cancel_selected action -------------------------------------------------------------------


def action(client: Client, ids: list, **extra: str):
    data = {"action": "cancel_selected", "_selected_action": [str(i) for i in ids], **extra}
    return client.post(url("workflowrun", "changelist"), data)


def test_cancel_selected_confirms_then_cancels_active_runs(admin_client: Client) -> None:
    pending, waiting = make_run("pending"), make_run("waiting", waiting_on="sleep:nap")
    done = make_run("completed")
    before = snapshot()
    confirm = action(admin_client, [pending.pk, waiting.pk, done.pk])
    assert confirm.status_code == 200
    assert b'name="reason"' in confirm.content and str(pending.pk).encode() in confirm.content
    assert snapshot() == before  # the confirmation page changes nothing
    response = action(
        admin_client, [pending.pk, waiting.pk, done.pk], confirm="yes", reason="bulk cleanup"
    )
    assert response.status_code == 302
    statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
    assert statuses == {pending.pk: "canceled", waiting.pk: "canceled", done.pk: "completed"}
    assert WorkflowRun.objects.get(pk=pending.pk).cancel_reason == "bulk cleanup"


def test_cancel_selected_says_which_runs_ended_and_which_were_asked_to_stop(
    admin_client: Client,
) -> None:
    pending, running = make_run("pending"), make_run("running")
    response = action(admin_client, [pending.pk, running.pk], confirm="yes", reason="flush")
    said = [str(m) for m in response.wsgi_request._messages]
    assert said == [
        "Canceled 1 run(s); cancel requested for 1 running run(s): their workers stop them at"
        " their next heartbeat."
    ]
    only_idle = action(
        admin_client,
        [make_run("waiting", waiting_on="sleep:nap").pk],
        confirm="yes",
        reason="flush",
    )
    assert [str(m) for m in only_idle.wsgi_request._messages][-1] == "Canceled 1 run(s)."


def test_cancel_selected_is_refused_without_permission(staff: Client) -> None:
    run = make_run("pending")
    page = staff.get(url("workflowrun", "changelist"))
    assert b"cancel_selected" not in page.content
    before = snapshot()
    assert action(staff, [run.pk]).status_code == 403
    assert action(staff, [run.pk], confirm="yes", reason="x").status_code == 403
    assert snapshot() == before


def test_cancel_selected_is_offered_with_permission(canceller: Client) -> None:
    run = make_run("pending")
    assert b"cancel_selected" in canceller.get(url("workflowrun", "changelist")).content
    action(canceller, [run.pk], confirm="yes", reason="ok")
    run.refresh_from_db()
    assert run.status == "canceled"


def test_engine_enqueued_run_can_be_canceled_from_the_admin(admin_client: Client) -> None:
    res = tasks_engine.enqueue("noop", {"n": 1})
    admin_client.post(url("workflowrun", "cancel", res.run_id), {"reason": "enqueued"})
    view = tasks_engine.get_run(res.run_id)
    assert view is not None
    assert (view.status, view.cancel_reason) == ("canceled", "enqueued")


def test_a_reason_with_a_nul_character_is_refused_and_nothing_changes(
    admin_client: Client,
) -> None:
    """PostgreSQL cannot store a NUL: refused with a message on both databases, not a 500."""
    run = make_run("waiting", waiting_on="sleep:nap")
    cancel_url = url("workflowrun", "cancel", run.pk)
    response = admin_client.post(cancel_url, {"reason": "a\x00b"}, follow=True)
    assert response.status_code == 200
    assert b"NUL character" in response.content
    run.refresh_from_db()
    assert (run.status, run.cancel_reason, run.cancel_requested_at) == ("waiting", "", None)
    changelist = url("workflowrun", "changelist")
    selected = {"action": "cancel_selected", "_selected_action": [str(run.pk)]}
    response = admin_client.post(
        changelist, {**selected, "confirm": "yes", "reason": "x\x00"}, follow=True
    )
    assert b"NUL character" in response.content
    run.refresh_from_db()
    assert run.status == "waiting"


def test_a_reason_longer_than_the_limit_is_refused_and_nothing_changes(
    admin_client: Client,
) -> None:
    """The admin cut a reason to 2,000 characters without a word; now the engine's limit
    refuses it with a message, on the run page's form and the list action alike."""
    run = make_run("waiting", waiting_on="sleep:nap")
    long = "r" * 2001
    response = admin_client.post(
        url("workflowrun", "cancel", run.pk), {"reason": long}, follow=True
    )
    assert response.status_code == 200
    assert b"eason is 2001 characters long: at most 2000" in response.content
    run.refresh_from_db()
    assert (run.status, run.cancel_reason, run.cancel_requested_at) == ("waiting", "", None)
    selected = {"action": "cancel_selected", "_selected_action": [str(run.pk)]}
    response = admin_client.post(
        url("workflowrun", "changelist"),
        {**selected, "confirm": "yes", "reason": long},
        follow=True,
    )
    assert b"eason is 2001 characters long" in response.content
    run.refresh_from_db()
    assert (run.status, run.cancel_requested_at) == ("waiting", None)
