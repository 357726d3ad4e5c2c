"""manage.py tasks: enqueue, inspect, list, signal, cancel, prune; --json and clear errors."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def tasks(*args: str) -> str:
    out = StringIO()
    call_command("tasks", *args, stdout=out)
    return out.getvalue()


def test_enqueue_json_and_dedupe() -> None:
    first = json.loads(
        tasks(
            "enqueue",
            "noop",
            "--input",
            '{"n": 2}',
            "--idempotency-key",
            "k",
            "--priority",
            "3",
            "--json",
        )
    )
    assert first["deduplicated"] is False
    run = WorkflowRun.objects.get(pk=first["run_id"])
    assert (run.input, run.priority, run.idempotency_key) == ({"n": 2}, 3, "k")
    again = json.loads(
        tasks("enqueue", "noop", "--input", '{"n": 2}', "--idempotency-key", "k", "--json")
    )
    assert again == {"run_id": first["run_id"], "deduplicated": True}


def test_enqueue_with_a_queueing_key_answers_the_queued_run() -> None:
    first = json.loads(tasks("enqueue", "noop", "--queueing-key", "scan", "--json"))
    again = json.loads(tasks("enqueue", "noop", "--queueing-key", "scan", "--json"))
    assert again == {"run_id": first["run_id"], "deduplicated": True}
    assert json.loads(tasks("inspect", first["run_id"], "--json"))["queueing_key"] == "scan"


def test_enqueue_with_a_debounce_key_answers_the_windows_run() -> None:
    first = json.loads(tasks("enqueue", "flow-debounce", "--debounce-key", "d", "--json"))
    again = json.loads(
        tasks("enqueue", "flow-debounce", "--input", '{"n": 2}', "--debounce-key", "d", "--json")
    )
    assert again == {"run_id": first["run_id"], "deduplicated": True}
    shown = json.loads(tasks("inspect", first["run_id"], "--json"))
    assert shown["debounce_key"] == "d" and shown["input"]["n"] == 2


def test_enqueue_with_version_and_queue() -> None:
    out = json.loads(tasks("enqueue", "a@1", "--queue", "io", "--json"))
    run = WorkflowRun.objects.get(pk=out["run_id"])
    assert (run.version, run.queue) == (1, "io")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "nope"], "unknown task 'nope'"),
        (["enqueue", "noop", "--input", '{"n": "x"}'], "invalid input: n"),
        (["inspect", str(uuid.UUID(int=1))], "no run with id"),
        (["inspect", "not-a-uuid"], "not a UUID"),
        (["cancel", str(uuid.UUID(int=1))], "no run with id"),
        (["signal", str(uuid.UUID(int=1)), "x"], "no run with id"),
        # The version is read before anything is written (a run was enqueued first, before).
        (["enqueue", "noop@abc", "--input", '{"n": 2}'], "expected NAME or NAME@VERSION"),
        (["enqueue", "noop@", "--input", '{"n": 2}'], "expected NAME or NAME@VERSION"),
        (["enqueue", "noop", "--queue", ""], "queue must be a non-empty string"),
        # Longer than the columns: PostgreSQL raised a DataError, SQLite stored them.
        (["enqueue", "noop", "--queue", "q" * 101], "queue is 101 characters long: at most 100"),
        (["enqueue", "noop", "--idempotency-key", "k" * 256], "idempotency_key is 256"),
        (["enqueue", "noop", "--queueing-key", ""], "queueing_key of noop@1 must be a non-empty"),
        (["enqueue", "noop", "--priority", "99999999999"], "priority must be between"),
        (["enqueue", "noop", "--debounce-key", "k"], "declares no debounce"),
        (["enqueue", "flow-debounce", "--debounce-key", ""], "debounce_key of flow-debounce"),
        (["enqueue", "noop", "--inputs", "-", "--debounce-key", "k"], "--debounce-key"),
    ],
)
def test_errors_are_clear_and_write_nothing(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        tasks(*args)
    assert WorkflowRun.objects.count() == 0


def test_idempotency_conflict_is_a_command_error() -> None:
    tasks("enqueue", "noop", "--input", '{"n": 1}', "--idempotency-key", "k")
    with pytest.raises(CommandError, match="different input"):
        tasks("enqueue", "noop", "--input", '{"n": 9}', "--idempotency-key", "k")
    assert WorkflowRun.objects.count() == 1


def test_inspect_and_list_json(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("three_steps", {"n": 1})
    drain(fake_clock)
    view = json.loads(tasks("inspect", str(res.run_id), "--json"))
    assert view["run_id"] == str(res.run_id)
    assert view["status"] == "completed"
    assert [s["name"] for s in view["steps"]] == ["a", "b", "c"]
    assert isinstance(view["created_at"], str)
    listed = json.loads(tasks("list", "--status", "completed", "--json"))
    assert [r["run_id"] for r in listed] == [str(res.run_id)]
    assert listed[0]["steps"] == []
    assert "three_steps@1" in tasks("inspect", str(res.run_id))
    assert json.loads(tasks("list", "--task", "nope", "--json")) == []


def test_signal_and_cancel_json() -> None:
    res = tasks_engine.enqueue("fact_waiter")
    out = json.loads(tasks("signal", str(res.run_id), "item", "--payload", '{"a": 1}', "--json"))
    assert out == {"delivered": True, "status": "pending"}
    assert json.loads(tasks("cancel", str(res.run_id), "--reason", "r", "--json")) == {
        "canceled": True
    }
    assert json.loads(tasks("cancel", str(res.run_id), "--json")) == {"canceled": False}
    out = json.loads(tasks("signal", str(res.run_id), "item", "--json"))
    assert out == {"delivered": False, "status": "canceled"}


def test_prune_deletes_only_old_finished_runs(fake_clock: FakeClock) -> None:
    old = tasks_engine.enqueue("b")
    drain(fake_clock)
    pending = tasks_engine.enqueue("b", available_at=fake_clock.now().replace(year=2099))
    fake_clock.advance(3 * 86400)
    fresh = tasks_engine.enqueue("b")
    drain(fake_clock)
    out = json.loads(tasks("prune", "--older-than", "2", "--json"))
    assert out["runs"] == 1
    remaining = set(WorkflowRun.objects.values_list("pk", flat=True))
    assert remaining == {pending.run_id, fresh.run_id}
    assert old.run_id not in remaining


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["go", "--payload", '"a\\u0000b"'], "cannot be stored as JSON"),
        (["go", "--idempotency-key", ""], "idempotency_key must be a non-empty string"),
        (["go", "--idempotency-key", "k" * 256], "idempotency_key is 256 characters long"),
        (["x" * 201], "fact name is 201 characters long: at most 200"),
    ],
)
def test_bad_signals_are_one_line_errors_and_store_no_fact(args: list[str], message: str) -> None:
    from tasks_engine.models import Fact

    run_id = tasks_engine.enqueue("noop", {"n": 1}).run_id
    with pytest.raises(CommandError, match=message):
        tasks("signal", str(run_id), *args)
    assert Fact.objects.count() == 0


@pytest.mark.parametrize("days", ["1e308", "1000000", "-1", "nan"])
def test_a_prune_age_past_what_a_date_can_count_back_is_a_usage_error(
    days: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It raised OverflowError with a traceback (the cut-off date before the year 1)."""
    tasks_engine.enqueue("noop", {"n": 1})
    with pytest.raises(SystemExit) as exited:
        tasks("prune", "--older-than", days)
    assert exited.value.code == 2
    assert "a number of days from 0 to 36500" in capsys.readouterr().err
    assert WorkflowRun.objects.count() == 1


DEEP_JSON = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize(
    "args",
    [
        ["enqueue", "b", "--input", DEEP_JSON],
        ["signal", "RUN", "item", "--payload", DEEP_JSON],
        ["signal", "RUN", "item", "--payload", '{"a": ' * 50_000 + "1" + "}" * 50_000],
    ],
    ids=["enqueue-input", "signal-payload-list", "signal-payload-object"],
)
def test_json_nested_too_deeply_is_a_one_line_usage_error(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed a 62-line RecursionError traceback (nothing was written)."""
    from tasks_engine.models import Fact

    run_id = str(tasks_engine.enqueue("noop", {"n": 1}).run_id)
    with pytest.raises(SystemExit) as exited:
        tasks(*[run_id if a == "RUN" else a for a in args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested too deeply" in err, err
    assert (WorkflowRun.objects.count(), Fact.objects.count()) == (1, 0)
