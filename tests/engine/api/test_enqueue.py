"""enqueue, get_run, list_runs, cancel of idle runs: validation, idempotency, transactions."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pydantic
import pytest
from django.db import transaction

import tasks_engine
from tasks_engine import IdempotencyConflict, UnknownRunError, UnknownTaskError
from tasks_engine.models import StepAttempt, WorkflowRun

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int]:
    return WorkflowRun.objects.count(), StepAttempt.objects.count()


def test_enqueue_creates_pending_run_with_validated_input() -> None:
    res = tasks_engine.enqueue("noop", {"n": "7"}, trace_id="t-1", priority=5)
    assert res.deduplicated is False
    view = tasks_engine.get_run(str(res.run_id))
    assert view is not None
    assert view.status == "pending"
    assert view.input == {"n": 7}  # validated and coerced, stored as JSON
    assert (view.task_name, view.version, view.queue) == ("noop", 1, "default")
    assert (view.priority, view.trace_id, view.attempts) == (5, "t-1", 0)
    assert view.steps == []


def test_workflow_object_enqueue_and_latest_version() -> None:
    from tests.testapp.workflows import noop

    res = noop.enqueue({"n": 1})
    assert tasks_engine.get_run(res.run_id).task_name == "noop"
    latest = tasks_engine.enqueue("a")
    assert tasks_engine.get_run(latest.run_id).version == 2
    pinned = tasks_engine.enqueue("a", version=1)
    assert tasks_engine.get_run(pinned.run_id).version == 1


def test_bad_input_raises_validation_error_and_writes_nothing() -> None:
    before = counts()
    with pytest.raises(pydantic.ValidationError):
        tasks_engine.enqueue("noop", {"n": "not a number"})
    assert counts() == before


def test_unknown_task_and_version_write_nothing() -> None:
    before = counts()
    with pytest.raises(UnknownTaskError):
        tasks_engine.enqueue("no-such-task", {})
    with pytest.raises(UnknownTaskError):
        tasks_engine.enqueue("a", {}, version=99)
    assert counts() == before


@pytest.mark.parametrize("version", ["1", True, 1.0, [1]])
def test_a_version_that_is_no_integer_is_a_type_error_and_writes_nothing(version: object) -> None:
    """ "1" was refused as "unknown task a@1" while a@1 is registered (a misleading error);
    True and 1.0 enqueued version 1. list_runs(version=) refuses the same values."""
    from tests.testapp.workflows import a_v1

    before = counts()
    for task in ("a", a_v1):
        with pytest.raises(TypeError, match="version must be an integer"):
            tasks_engine.enqueue(task, {}, version=version)  # type: ignore[arg-type]
    assert counts() == before


def test_a_workflow_object_with_version_0_is_no_silent_default() -> None:
    """enqueue(wf, version=0) ran the object's own version (`version or wf.version`)."""
    from tests.testapp.workflows import a_v1

    before = counts()
    with pytest.raises(UnknownTaskError, match="a@0"):
        tasks_engine.enqueue(a_v1, {}, version=0)
    assert counts() == before
    assert tasks_engine.get_run(tasks_engine.enqueue(a_v1, {}).run_id).version == 1


def test_idempotency_key_dedupes_same_input_after_validation() -> None:
    first = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="k1")
    again = tasks_engine.enqueue("noop", {"n": "1"}, idempotency_key="k1")
    assert again == tasks_engine.Enqueued(first.run_id, True)
    assert WorkflowRun.objects.count() == 1


def test_idempotency_conflict_on_different_input_writes_nothing() -> None:
    tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="k1")
    before = counts()
    with pytest.raises(IdempotencyConflict):
        tasks_engine.enqueue("noop", {"n": 2}, idempotency_key="k1")
    assert counts() == before


def test_idempotency_keys_are_scoped_to_the_task() -> None:
    one = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="shared")
    other = tasks_engine.enqueue("three_steps", {"n": 1}, idempotency_key="shared")
    assert one.run_id != other.run_id


def test_enqueue_rolls_back_with_the_callers_transaction() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        tasks_engine.enqueue("noop", {"n": 1})
        tasks_engine.enqueue("noop", {"n": 2}, idempotency_key="in-tx")
        raise Boom
    assert WorkflowRun.objects.count() == 0


def test_get_run_of_unknown_id_is_none_and_list_filters() -> None:
    assert tasks_engine.get_run(uuid.uuid4()) is None
    assert tasks_engine.get_run("not-a-uuid") is None
    tasks_engine.enqueue("noop", {"n": 1})
    tasks_engine.enqueue("b")
    assert [v.task_name for v in tasks_engine.list_runs(task="b")] == ["b"]
    assert len(tasks_engine.list_runs(status="pending")) == 2
    assert tasks_engine.list_runs(status="completed") == []
    assert len(tasks_engine.list_runs(limit=1)) == 1
    with pytest.raises(ValueError):
        tasks_engine.list_runs(status="bogus")


def test_cancel_pending_run_and_cancel_of_finished_or_unknown() -> None:
    res = tasks_engine.enqueue("noop", {"n": 1})
    assert tasks_engine.cancel(res.run_id, reason="not needed") is True
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "canceled"
    assert view.cancel_reason == "not needed"
    assert view.cancel_requested_at is not None and view.finished_at is not None
    assert tasks_engine.cancel(res.run_id) is False
    with pytest.raises(UnknownRunError):
        tasks_engine.cancel(uuid.uuid4())
    with pytest.raises(UnknownRunError):
        tasks_engine.cancel("garbage")


def test_signal_to_unknown_or_finished_run() -> None:
    with pytest.raises(UnknownRunError):
        tasks_engine.signal(uuid.uuid4(), "x")
    res = tasks_engine.enqueue("noop", {"n": 1})
    tasks_engine.cancel(res.run_id)
    out = tasks_engine.signal(res.run_id, "x", {"a": 1})
    assert out == tasks_engine.Signaled(False, "canceled")


def test_a_run_view_says_whether_the_run_finished() -> None:
    """`RunView.finished` (public, for callers that poll a run): completed, failed or canceled,
    never an active status."""
    run_id = tasks_engine.enqueue("noop", {"n": 1}).run_id
    assert tasks_engine.get_run(run_id).finished is False
    tasks_engine.cancel(run_id)
    assert tasks_engine.get_run(run_id).finished is True
    canceled = tasks_engine.get_run(run_id)
    assert canceled is not None
    finished = {"completed", "failed", "canceled"}
    for status in ("pending", "running", "waiting", *finished):
        assert dataclasses.replace(canceled, status=status).finished is (status in finished)


def test_a_name_resolves_to_its_newest_version_and_unregistering_one_falls_back() -> None:
    from tasks_engine.definitions import Registry, registry, workflow

    reg = Registry()
    one = workflow(name="versions-probe", version=1)(lambda ctx: None)
    three = workflow(name="versions-probe", version=3)(lambda ctx: None)
    registry.unregister("versions-probe", 1)  # the decorator registered them globally too
    registry.unregister("versions-probe", 3)
    for wf in (three, one):  # registered out of order
        reg.register(wf)
    assert reg.get("versions-probe") is three
    reg.unregister("versions-probe", 3)
    assert reg.get("versions-probe") is one
    reg.unregister("versions-probe", 1)
    with pytest.raises(UnknownTaskError):
        reg.get("versions-probe")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"queue": 3}, TypeError, "workflow queue must be a non-empty string, not 3"),
        ({"queue": ""}, ValueError, "workflow queue must be a non-empty string, not ''"),
        ({"queue": "q" * 101}, ValueError, "workflow queue is 101 characters long: at most 100"),
        ({"queue": "a\x00b"}, ValueError, "workflow queue must not contain a NUL character"),
        ({"name": b"n"}, TypeError, "workflow name must be a non-empty string, not b'n'"),
        ({"name": "n" * 201}, ValueError, "workflow name is 201 characters long: at most 200"),
    ],
)
def test_workflow_text_arguments_follow_the_rule_enqueue_applies(
    options: dict, error: type[Exception], message: str
) -> None:
    """@workflow's name and queue, enqueue's queue and keys, runworker's --queue: one rule
    (tasks_engine.values.text.check_text), one wording; @workflow keeps TypeError for a
    non-string."""
    from tasks_engine.definitions import registry, workflow

    before = registry.pairs()
    with pytest.raises(error, match=message):
        workflow(**{"name": "text-probe", **options})(lambda ctx: None)
    assert registry.pairs() == before


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"queue": ""}, ValueError, "queue must be a non-empty string"),
        ({"queue": "q" * 101}, ValueError, "queue is 101 characters long: at most 100"),
        ({"queue": "a\x00b"}, ValueError, "queue must not contain a NUL"),
        ({"idempotency_key": ""}, ValueError, "idempotency_key must be a non-empty string"),
        ({"idempotency_key": "k" * 256}, ValueError, "idempotency_key is 256 characters"),
        (
            {"concurrency_key": "c" * 256},
            ValueError,
            "concurrency_key of noop@1 is 256 characters long: at most 255",
        ),
        ({"trace_id": "t" * 65}, ValueError, "trace_id is 65 characters long: at most 64"),
        ({"priority": 2**31}, ValueError, "priority must be between"),
        ({"priority": -(2**31) - 1}, ValueError, "priority must be between"),
        ({"priority": True}, TypeError, "priority must be an integer"),
        ({"priority": "3"}, TypeError, "priority must be an integer"),
        # These raised AttributeError ('float' object has no attribute 'tzinfo').
        ({"deadline_at": 5.0}, TypeError, "deadline_at must be a datetime, not 5.0"),
        ({"deadline_at": timedelta(hours=1)}, TypeError, "deadline_at must be a datetime"),
        ({"available_at": "2030-01-01T00:00:00Z"}, TypeError, "available_at must be a datetime"),
        ({"available_at": date(2030, 1, 1)}, TypeError, "available_at must be a datetime"),
        # Naive ones were stored with only a RuntimeWarning from Django.
        ({"available_at": datetime(2030, 1, 1)}, ValueError, "available_at must be timezone-aware"),
        ({"deadline_at": datetime(2030, 1, 1)}, ValueError, "deadline_at must be timezone-aware"),
    ],
)
def test_arguments_the_columns_cannot_hold_are_refused_and_write_nothing(
    options: dict, error: type[Exception], message: str
) -> None:
    """The same answer on both databases: PostgreSQL refused these with a DataError from the
    insert, SQLite stored them (300 characters read back from a 100-character column)."""
    before = counts()
    with pytest.raises(error, match=message):
        tasks_engine.enqueue("noop", {"n": 1}, **options)
    assert counts() == before


def test_the_widest_values_the_columns_hold_are_stored() -> None:
    run_id = tasks_engine.enqueue(
        "noop",
        {"n": 1},
        queue="q" * 100,
        idempotency_key="k" * 255,
        concurrency_key="c" * 255,
        priority=2**31 - 1,
    ).run_id
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.queue, run.idempotency_key, run.concurrency_key) == (
        "q" * 100,
        "k" * 255,
        "c" * 255,
    )
    assert run.priority == 2**31 - 1


def test_signal_checks_the_run_before_the_payload_and_answers_a_plain_status() -> None:
    from tasks_engine.models import Fact

    with pytest.raises(UnknownRunError):
        tasks_engine.signal(uuid.uuid4(), "x", float("nan"))
    run_id = tasks_engine.enqueue("noop", {"n": 1}).run_id
    with pytest.raises(ValueError, match="fact name is 201 characters long"):
        tasks_engine.signal(run_id, "x" * 201)
    with pytest.raises(ValueError, match="fact name must be a non-empty string"):
        tasks_engine.signal(run_id, "")
    assert Fact.objects.count() == 0
    first = tasks_engine.signal(run_id, "x", idempotency_key="s1")
    again = tasks_engine.signal(run_id, "x", idempotency_key="s1")
    assert first == again == tasks_engine.Signaled(True, "pending")
    assert type(first.status) is str and type(again.status) is str


def test_a_child_key_too_long_for_the_column_is_its_step_keys_digest() -> None:
    from tasks_engine.runtime.waits import _child_key

    run_id = uuid.UUID(int=7)
    assert _child_key(run_id, "copy", 1) == f"child:{run_id}:copy"
    assert _child_key(run_id, "copy", 2) == f"child:{run_id}:copy:pass2"
    long_key = "s" * 300
    hashed = _child_key(run_id, long_key, 2)
    assert len(hashed) <= 255 and hashed.endswith(":pass2")
    assert hashed != _child_key(run_id, "t" * 300, 2)
    assert hashed == _child_key(run_id, long_key, 2)


def test_a_reason_that_is_not_a_string_is_refused_and_changes_nothing() -> None:
    run_id = tasks_engine.enqueue("noop", {"n": 1}).run_id
    with pytest.raises(TypeError, match="reason must be a string, not int"):
        tasks_engine.cancel(run_id, reason=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason must be a string"):
        tasks_engine.retry_run(run_id, reason=["x"])  # type: ignore[arg-type]
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.cancel_reason) == ("pending", "")


def test_aware_times_in_any_zone_are_stored_as_the_same_instant() -> None:
    berlin = datetime(2030, 1, 1, 12, tzinfo=ZoneInfo("Europe/Berlin"))
    run_id = tasks_engine.enqueue(
        "noop", {"n": 1}, available_at=berlin, deadline_at=berlin + timedelta(days=1)
    ).run_id
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.available_at == datetime(2030, 1, 1, 11, tzinfo=UTC)
    assert run.deadline_at == datetime(2030, 1, 2, 11, tzinfo=UTC)


@pytest.mark.parametrize("limit", ["5", 2.7, float("nan"), True, None])
def test_list_runs_takes_an_integer_limit_only(limit: object) -> None:
    """ "5" and 2.7 were taken as 5 and 2 (int()), NaN failed with Python's own message."""
    tasks_engine.enqueue("noop", {"n": 1})
    with pytest.raises(ValueError, match=r"limit must be an integer, not "):
        tasks_engine.list_runs(limit=limit)  # type: ignore[arg-type]
