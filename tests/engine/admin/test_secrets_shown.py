"""What operators see never shows a secret: progress messages are stored redacted; the admin's
pages and `tasks inspect` mask credentials in URLs and the values of secret-looking keys in a
run's input, output, progress, step outputs, facts and ledger results, while the workflow and
`get_run()` keep the real values."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

import tasks_engine
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tests.browser.rundata import add_step, make_run
from tests.engine.admin.test_admin import VIEW_ALL, staff_client
from tests.helpers import FakeClock, drain
from umt.models import AcquisitionPlan

pytestmark = pytest.mark.django_db

PASSKEY = "0123456789abcdef0123"
MAGNET = (
    "magnet:?xt=urn:btih:c9e15763f722f23e98a29decdfae341b98d53056&dn=Sintel"
    f"&tr=https%3A%2F%2Ftracker.example.org%2Fannounce%3Fpasskey%3D{PASSKEY}"
)
SECRETS = ("hunter2", "AKIA-SEKRIT-1", "pw-XYZZY", "tok-QWERTY", PASSKEY)
DATA: dict[str, Any] = {
    "dsn": "postgres://umt:hunter2@db.example/umt",
    "api_key": "AKIA-SEKRIT-1",
    "files": [{"path": "/media/a.mkv", "login": {"user": "umt", "password": "pw-XYZZY"}}],
    "hook": "https://hooks.example/notify?access_token=tok-QWERTY&page=2",
    "magnet": MAGNET,
}


def assert_masked(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text
    assert "[redacted]" in text
    assert "db.example/umt" in text and "/media/a.mkv" in text  # what is not secret stays


def secret_run() -> WorkflowRun:
    run = make_run(
        "completed",
        input=DATA,
        output={"result": DATA},
        progress={"done": 1, "total": 2, "message": "to postgres://umt:hunter2@db.example/umt"},
    )
    add_step(run, "fetch", run.created_at, 1.0, output=DATA)
    Fact.objects.create(run=run, name="download-done", payload=DATA, created_at=run.created_at)
    OpLedger.objects.create(
        op_key="op:secret",
        run=run,
        attempt_token=uuid.uuid4(),
        status="done",
        result=DATA,
        created_at=run.created_at,
        updated_at=run.created_at,
    )
    return run


def page(client: Client, model: str, *args: Any) -> str:
    response = client.get(reverse(f"admin:tasks_engine_{model}_change", args=args))
    assert response.status_code == 200
    return response.content.decode()


# -- progress messages (stored redacted) ------------------------------------------------------


def test_a_progress_message_is_stored_redacted(fake_clock: FakeClock) -> None:
    message = "connecting to postgres://umt:hunter2@db.example/umt with token=tok-QWERTY"
    run_id = tasks_engine.enqueue("progress_says", {"message": message}).run_id
    drain(fake_clock, horizon=0)
    stored = WorkflowRun.objects.get(pk=run_id)
    assert stored.status == "waiting"
    assert stored.progress == {
        "done": 1,
        "total": 2,
        "message": "connecting to postgres://umt:[redacted]@db.example/umt with token=[redacted]",
    }
    view = tasks_engine.get_run(run_id)
    assert view is not None and view.progress == stored.progress
    assert view.input == {"message": message}  # the input is the workflow's: kept as given


# -- the admin's pages ------------------------------------------------------------------------


def test_a_view_only_staff_user_sees_the_run_page_masked() -> None:
    run = secret_run()
    text = page(staff_client(*VIEW_ALL), "workflowrun", run.pk)
    assert_masked(text)
    assert 'id="progress"' in text and "postgres://umt:[redacted]@db.example/umt" in text
    assert "&quot;api_key&quot;: &quot;[redacted]&quot;" in text  # the key is kept, its value not
    assert "tracker.example.org" in text  # the magnet's tracker, without its passkey


@pytest.mark.parametrize("model", ["stepattempt", "fact", "opledger"])
def test_the_pages_of_a_runs_rows_are_masked(model: str) -> None:
    run = secret_run()
    row = {
        "stepattempt": StepAttempt.objects.get(run=run),
        "fact": Fact.objects.get(run=run),
        "opledger": OpLedger.objects.get(run=run),
    }[model]
    assert_masked(page(staff_client(*VIEW_ALL), model, row.pk))


def test_the_runs_list_shows_no_secret() -> None:
    secret_run()
    response = staff_client(*VIEW_ALL).get(reverse("admin:tasks_engine_workflowrun_changelist"))
    assert response.status_code == 200
    for secret in SECRETS:
        assert secret not in response.content.decode()


def test_the_api_keeps_the_real_values() -> None:
    run = secret_run()
    view = tasks_engine.get_run(run.pk)
    assert view is not None
    assert view.input == DATA and view.output == {"result": DATA}
    assert view.steps[0].output == DATA


def test_the_plan_page_masks_the_trackers_passkey() -> None:
    plan = AcquisitionPlan.objects.create(title="Sintel (2010)", source=MAGNET)
    client = staff_client("view_acquisitionplan")
    response = client.get(reverse("admin:umt_acquisitionplan_change", args=[plan.pk]))
    assert response.status_code == 200
    text = response.content.decode()
    assert PASSKEY not in text
    assert "tracker.example.org" in text and "Sintel" in text
    plan.refresh_from_db()
    assert plan.source == MAGNET  # the workflow still gets the real one


# -- tasks inspect ----------------------------------------------------------------------------


def inspect(*args: str) -> str:
    out = StringIO()
    call_command("tasks", "inspect", *args, stdout=out)
    return out.getvalue()


def test_inspect_masks_text_and_json() -> None:
    run = secret_run()
    assert_masked(inspect(str(run.pk)))
    raw = inspect(str(run.pk), "--json")
    assert_masked(raw)
    data = json.loads(raw)
    assert data["input"]["api_key"] == "[redacted]"
    assert data["input"]["files"][0]["path"] == "/media/a.mkv"
    assert data["steps"][0]["output"]["dsn"] == "postgres://umt:[redacted]@db.example/umt"
    assert data["progress"]["message"] == "to postgres://umt:[redacted]@db.example/umt"
    login = data["output"]["result"]["files"][0]["login"]
    assert login == {"user": "umt", "password": "[redacted]"}


def test_tasks_list_json_masks_the_runs_data() -> None:
    run = secret_run()
    out = StringIO()
    call_command("tasks", "list", "--json", stdout=out)
    assert_masked(out.getvalue())
    (shown,) = json.loads(out.getvalue())
    assert shown["run_id"] == str(run.pk) and shown["input"]["api_key"] == "[redacted]"


# -- a magnet's tracker passkeys (issue 40, item 7) -------------------------------------------

# The forms private trackers use: the passkey as a query parameter, and as the path segment
# before `/announce`, each as a real magnet carries it (percent-encoded in `tr=`) and pasted
# unencoded.
TRACKERS = (
    "http://tracker.example/announce?passkey=abc123",
    "http://tracker.example/abc123def/announce",
)
HASH = "c9e15763f722f23e98a29decdfae341b98d53056"
PASSKEY_MAGNETS = [
    f"magnet:?xt=urn:btih:{HASH}&dn=Sintel&tr={quote(tracker, safe='')}" for tracker in TRACKERS
] + [f"magnet:?xt=urn:btih:{HASH}&tr={tracker}&dn=Sintel" for tracker in TRACKERS]


def assert_no_passkey(text: str) -> None:
    assert "abc123" not in text  # neither the query's passkey nor the path's abc123def
    assert "tracker.example" in text and HASH in text  # what is not secret stays


def magnet_run(magnet: str) -> WorkflowRun:
    data = {"plan_id": 7, "source": magnet}
    run = make_run(
        "failed",
        input=data,
        output={"result": data},
        error={"type": "umt.downloads.BadSource", "message": f"cannot read {magnet!r}"},
        progress={"done": 0, "total": None, "message": f"failed: cannot read {magnet}"},
    )
    add_step(run, "submit-download", run.created_at, 1.0, output=data)
    Fact.objects.create(run=run, name="download-done", payload=data, created_at=run.created_at)
    OpLedger.objects.create(
        op_key="submit:7",
        run=run,
        attempt_token=uuid.uuid4(),
        status="done",
        result=data,
        created_at=run.created_at,
        updated_at=run.created_at,
    )
    return run


@pytest.mark.parametrize("magnet", PASSKEY_MAGNETS)
def test_a_magnets_tracker_passkey_is_masked_on_every_page_and_in_inspect(magnet: str) -> None:
    run = magnet_run(magnet)
    plan = AcquisitionPlan.objects.create(
        title="Sintel", source=magnet, download_ref=magnet, failure=f"BadSource: {magnet}"
    )
    client = staff_client(*VIEW_ALL, "view_acquisitionplan")
    assert_no_passkey(page(client, "workflowrun", run.pk))
    assert_no_passkey(page(client, "stepattempt", StepAttempt.objects.get(run=run).pk))
    assert_no_passkey(page(client, "fact", Fact.objects.get(run=run).pk))
    assert_no_passkey(page(client, "opledger", OpLedger.objects.get(run=run).pk))
    response = client.get(reverse("admin:umt_acquisitionplan_change", args=[plan.pk]))
    assert response.status_code == 200
    assert_no_passkey(response.content.decode())
    for listed in ("admin:umt_acquisitionplan_changelist", "admin:tasks_engine_fact_changelist"):
        response = client.get(reverse(listed))
        assert response.status_code == 200 and "abc123" not in response.content.decode()
    assert_no_passkey(inspect(str(run.pk)))
    assert_no_passkey(inspect(str(run.pk), "--json"))
    plan.refresh_from_db()
    assert (plan.source, tasks_engine.get_run(run.pk).input["source"]) == (magnet, magnet)
