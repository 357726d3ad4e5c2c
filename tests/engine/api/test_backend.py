"""DurableBackend in-process (PostgreSQL and SQLite): enqueue, get_result, retries, signals."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued

import tasks_engine
from tasks_engine import IdempotencyConflict, clock, testing
from tasks_engine.backends import DJANGO_TASK, DurableBackend, DurableTask
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock, drain
from tests.testapp import django_tasks as t
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db

SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)


def effects(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def signals(result_id: str) -> list[str]:
    prefix = "signal:"
    keys = SideEffect.objects.filter(key__endswith=f":{result_id}").order_by("id")
    return [k.removeprefix(prefix).rsplit(":", 1)[0] for k in keys.values_list("key", flat=True)]


def test_the_configured_backend_is_durable_and_says_what_it_supports() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert (
        backend.supports_defer,
        backend.supports_get_result,
        backend.supports_priority,
        backend.supports_async_task,
    ) == (True, True, True, True)
    assert isinstance(t.add, DurableTask)
    assert backend.check() == []


def test_enqueue_writes_a_pending_single_step_run(settings: Any) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "tasks_engine.backends.DurableBackend",
            "QUEUES": ["default", "reports"],  # without QUEUES only "default", as in Django
        }
    }
    result = t.add.using(priority=7, queue_name="reports").enqueue(2, b=3)
    assert result.status == READY
    run = WorkflowRun.objects.get(pk=result.id)
    assert (run.task_name, run.status, run.priority, run.queue) == (
        DJANGO_TASK,
        "pending",
        7,
        "reports",
    )
    assert run.input["task"] == "tests.testapp.django_tasks.add"
    assert (run.input["args"], run.input["kwargs"], run.input["max_attempts"]) == ([2], {"b": 3}, 1)
    assert (result.args, result.kwargs, result.worker_ids, result.errors) == ([2], {"b": 3}, [], [])
    assert result.enqueued_at == run.created_at


def test_success_maps_output_workers_and_times(fake_clock: FakeClock) -> None:
    result = t.add.enqueue(2, 3)
    assert drain(fake_clock) == ["completed"]
    got = t.add.get_result(result.id)  # rebuilt from the module path: the function matches
    assert got.status == SUCCESSFUL
    assert got.return_value == 5
    assert got.worker_ids == ["test-worker"] and got.attempts == 1
    assert got.started_at is not None and got.finished_at is not None
    assert got.last_attempted_at is not None and got.errors == []
    result.refresh()
    assert result.status == SUCCESSFUL and result.return_value == 5
    with pytest.raises(TaskResultMismatch):
        t.record.get_result(result.id)


def test_an_exception_fails_the_task_once_with_its_traceback(fake_clock: FakeClock) -> None:
    result = t.boom.enqueue("kaput")
    drain(fake_clock)
    got = t.boom.get_result(result.id)
    assert got.status == FAILED
    assert effects("boom:kaput") == 1  # runs once unless it asks for more
    [error] = got.errors
    assert error.exception_class_path == "tests.testapp.django_tasks.TaskBoom"
    assert error.exception_class is t.TaskBoom
    assert "raise TaskBoom(message)" in error.traceback and "TaskBoom: kaput" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = got.return_value


def test_max_attempts_retries_until_success(fake_clock: FakeClock) -> None:
    result = t.flaky.enqueue("f1", fail_times=2)
    drain(fake_clock)
    got = t.flaky.get_result(result.id)
    assert got.status == SUCCESSFUL and got.return_value == "f1: ok after 3"
    assert got.attempts == 3 and len(got.errors) == 2


def test_max_attempts_spent_fails_with_every_error(fake_clock: FakeClock) -> None:
    result = t.flaky.enqueue("f2", fail_times=9)
    drain(fake_clock)
    got = t.flaky.get_result(result.id)
    assert got.status == FAILED and effects("f2") == 3
    boom = "tests.testapp.django_tasks.TaskBoom"
    assert [e.exception_class_path for e in got.errors] == [boom] * 3


def test_using_max_attempts_overrides_the_decorator(fake_clock: FakeClock) -> None:
    twice = t.boom.using(max_attempts=2)  # type: ignore[call-arg]  # a DurableTask option
    assert isinstance(twice, DurableTask)
    result = twice.enqueue("twice")
    assert result.task.max_attempts == 2  # type: ignore[attr-defined]  # rebuilt as enqueued
    drain(fake_clock)
    assert t.boom.get_result(result.id).status == FAILED
    assert effects("boom:twice") == 2


def test_run_after_defers_the_start(fake_clock: FakeClock) -> None:
    when = clock.now() + timedelta(hours=1)
    result = t.record.using(run_after=when).enqueue("later")
    assert drain(fake_clock) == []  # nothing due within the drain's horizon
    assert t.record.get_result(result.id).status == READY
    fake_clock.advance(3600)
    assert drain(fake_clock) == ["completed"]
    got = t.record.get_result(result.id)
    assert got.status == SUCCESSFUL
    assert got.started_at is not None and got.started_at >= when
    assert got.task.run_after == when


def test_a_whole_float_priority_enqueues_as_django_validates_it() -> None:
    """Django's rule is "a whole number": `using(priority=5.0)` passed validation, then
    enqueue raised TypeError ("priority must be an integer") from the engine."""
    result = t.add.using(priority=5.0).enqueue(1, 2)  # type: ignore[arg-type]
    assert WorkflowRun.objects.get(pk=result.id).priority == 5
    assert result.task.priority == 5


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", float("nan")),  # ValueError from int(nan) in Django's check
        ("priority", "5"),  # TypeError comparing str and int
        ("priority", True),  # passed validation, then TypeError at enqueue
        ("run_after", date(2030, 1, 1)),  # AttributeError: no utcoffset
        ("run_after", timedelta(minutes=5)),
        # Year 10000 in UTC: SQLite raised OverflowError; PostgreSQL stored the run, and then
        # every read of its row failed (psycopg: "timestamp too large (after year 10K)").
        ("run_after", datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))),
    ],
)
def test_a_task_option_of_the_wrong_type_is_invalid_task(field: str, value: object) -> None:
    with pytest.raises(InvalidTask, match=field):
        t.add.using(**{field: value})  # type: ignore[arg-type]
    assert not WorkflowRun.objects.exists()


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(
    django_capture_on_commit_callbacks: Any,
) -> None:
    sent: list[str] = []

    def on_enqueued(sender: Any, task_result: Any, **kw: Any) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(on_enqueued)
    try:
        with (
            django_capture_on_commit_callbacks(execute=True),
            pytest.raises(RuntimeError),
            transaction.atomic(),
        ):
            t.record.enqueue("rolled-back")
            raise RuntimeError("business write failed")
        assert not WorkflowRun.objects.exists() and sent == []
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            kept = t.record.enqueue("kept")
        assert sent == [kept.id]
    finally:
        task_enqueued.disconnect(on_enqueued)
    assert [str(pk) for pk in WorkflowRun.objects.values_list("pk", flat=True)] == [kept.id]


def test_worker_sends_started_and_finished(fake_clock: FakeClock) -> None:
    ok, bad = t.add.enqueue(1, 1), t.flaky.enqueue("f3", fail_times=1)
    drain(fake_clock)
    assert signals(ok.id) == ["started:RUNNING", "finished:SUCCESSFUL"]
    assert signals(bad.id) == ["started:RUNNING", "started:RUNNING", "finished:SUCCESSFUL"]
    failed = t.boom.enqueue("signals")
    drain(fake_clock)
    assert signals(failed.id) == ["started:RUNNING", "finished:FAILED"]


def test_context_and_async_tasks(fake_clock: FakeClock) -> None:
    ctx_result = t.with_context.enqueue(4)
    async_result = t.async_double.enqueue(21)
    drain(fake_clock)
    assert t.with_context.get_result(ctx_result.id).return_value == {
        "value": 4,
        "id": ctx_result.id,
        "attempt": 1,
        "status": "RUNNING",
    }
    assert t.async_double.get_result(async_result.id).return_value == 42


def test_idempotency_key_dedupes_and_refuses_other_arguments() -> None:
    first = t.ship_order.enqueue(order_id=1)
    again = t.ship_order.enqueue(order_id=1)
    assert again.id == first.id
    assert WorkflowRun.objects.count() == 1
    with pytest.raises(IdempotencyConflict):
        t.ship_order.enqueue(order_id=1, note="different")
    other = t.ship_order.enqueue(order_id=2)
    assert other.id != first.id
    keyed = t.record.using(idempotency_key=lambda key: f"k-{key}")  # type: ignore[call-arg]
    assert keyed.enqueue("x").id == keyed.enqueue("x").id


def test_using_idempotency_key_none_clears_the_key_and_no_argument_keeps_it() -> None:
    """`using(idempotency_key=None)` kept the task's key: None stood for "not given", so a key
    once set could not be removed."""
    kept = t.ship_order.using(priority=3)  # type: ignore[call-arg]
    assert kept.idempotency_key == "order:{order_id}"  # type: ignore[attr-defined]
    assert kept.enqueue(order_id=1).id == kept.enqueue(order_id=1).id
    cleared = t.ship_order.using(idempotency_key=None)  # type: ignore[call-arg]
    assert cleared.idempotency_key is None  # type: ignore[attr-defined]
    assert cleared.enqueue(order_id=1).id != cleared.enqueue(order_id=1).id
    assert WorkflowRun.objects.count() == 3
    assert WorkflowRun.objects.filter(idempotency_key__isnull=True).count() == 2
    assert cleared.using(priority=1).idempotency_key is None  # type: ignore[attr-defined]
    rekeyed = cleared.using(idempotency_key="again:{order_id}")  # type: ignore[call-arg]
    assert rekeyed.idempotency_key == "again:{order_id}"  # type: ignore[attr-defined]


def test_an_idempotency_key_that_is_no_string_or_callable_is_invalid_task() -> None:
    """idempotency_key=5 passed `using()`, then enqueue raised AttributeError ('int' object
    has no attribute 'format')."""
    with pytest.raises(InvalidTask, match="idempotency_key must be a string or a callable"):
        t.record.using(idempotency_key=5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("key", "args", "message"),
    [
        # KeyError 'order_id': the key names an argument the call passed by position
        ("order:{order_id}", (5,), "does not format with the call's arguments"),
        ("order:{1}", (5,), "does not format with the call's arguments"),  # IndexError
        # A callable's None became the key "None": every call deduped into the first one
        (lambda key: None, ("a",), "returned None, not a string"),
    ],
)
def test_an_idempotency_key_that_gives_no_string_fails_the_enqueue_clearly(
    key: Any, args: tuple[Any, ...], message: str
) -> None:
    keyed = t.record.using(idempotency_key=key)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=message):
        keyed.enqueue(*args)
    assert not WorkflowRun.objects.exists()


def test_an_unimportable_task_path_fails_its_run_and_the_worker_goes_on(
    fake_clock: FakeClock,
) -> None:
    gone = tasks_engine.enqueue(DJANGO_TASK, {"task": "tests.testapp.no_such_module.task"})
    plain = tasks_engine.enqueue(DJANGO_TASK, {"task": "tests.testapp.django_tasks.not_a_task"})
    broken = tasks_engine.enqueue(DJANGO_TASK, {"task": "tests.testapp.broken_django_tasks.x"})
    good = t.add.enqueue(1, 2)
    assert sorted(drain(fake_clock)) == ["completed", "failed", "failed", "failed"]
    result = task_backends["default"].get_result(str(gone.run_id))
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class_path == "tasks_engine.backends.UnknownDjangoTask"
    assert "cannot import Django task 'tests.testapp.no_such_module.task'" in error.traceback
    assert result.task.name == "_missing_task"
    plain_error = task_backends["default"].get_result(str(plain.run_id)).errors[0].traceback
    assert "is a function, not a Django task" in plain_error
    broken_error = task_backends["default"].get_result(str(broken.run_id)).errors[0].traceback
    assert "RuntimeError('this module is broken on purpose')" in broken_error
    assert t.add.get_result(good.id).return_value == 3


def test_get_result_of_unknown_ids_raises() -> None:
    other = tasks_engine.enqueue("noop", {"n": 1})
    for bad in ("not-a-uuid", "00000000-0000-0000-0000-000000000000", str(other.run_id)):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(bad)


def test_invalid_tasks_and_arguments_write_nothing() -> None:
    with pytest.raises(InvalidTask, match="max_attempts"):
        t.durable_task(max_attempts=0)(t.not_a_task)
    with pytest.raises(TypeError, match="Unsupported type"):
        t.record.enqueue(object())  # type: ignore[arg-type]
    assert not WorkflowRun.objects.exists()


def test_unserialisable_return_value_fails_the_task(fake_clock: FakeClock) -> None:
    result = t.returns_object.enqueue()
    drain(fake_clock)
    got = t.returns_object.get_result(result.id)
    assert got.status == FAILED and got.errors[0].exception_class_path == "builtins.TypeError"


def test_a_canceled_task_reads_as_failed() -> None:
    result = t.record.enqueue("never")
    assert tasks_engine.cancel(result.id) is True
    assert t.record.get_result(result.id).status == FAILED


def test_a_failing_signal_receiver_does_not_change_the_outcome(fake_clock: FakeClock) -> None:
    """task_started and task_finished are sent robustly in the worker: Django logs the
    receiver's error ("django.dispatch") and the task's outcome stands."""
    from django.tasks.signals import task_finished, task_started

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("a receiver bug")

    task_started.connect(broken)
    task_finished.connect(broken)
    try:
        ok, bad = t.add.enqueue(2, 2), t.boom.enqueue("receiver")
        assert sorted(drain(fake_clock)) == ["completed", "failed"]
    finally:
        task_started.disconnect(broken)
        task_finished.disconnect(broken)
    got = t.add.get_result(ok.id)
    assert (got.status, got.return_value, got.attempts) == (SUCCESSFUL, 4, 1)
    failed = t.boom.get_result(bad.id)
    assert [e.exception_class for e in failed.errors] == [t.TaskBoom]


def test_attempts_count_only_calls_that_ran_not_the_give_up(fake_clock: FakeClock) -> None:
    """max_attempts=2 and both calls die with their worker: the worker that finds no attempt
    left records a failed row without calling the task. The result reports the two calls that
    ran, the give-up's error as the reason it failed (and so do rows written before the
    give-up row said what it is)."""
    import threading
    import uuid

    from tasks_engine import transitions
    from tasks_engine.models import StepAttempt
    from tasks_engine.runtime import executor

    twice = t.record.using(max_attempts=2)  # type: ignore[call-arg]  # a DurableTask option
    result = twice.enqueue("dies")
    for i in range(2):
        [claimed] = transitions.claim_runs(f"w{i}", [(DJANGO_TASK, 1)], None, 1, 30)
        run = WorkflowRun.objects.get(pk=result.id)
        executor.build_context(run, claimed.lease, threading.Event())  # closes the last one
        transitions.start_step(claimed.lease, "call", "function", i + 1, 1)  # then it dies
        fake_clock.advance(31)
    assert drain(fake_clock) == ["failed"]
    rows = StepAttempt.objects.filter(run_id=uuid.UUID(result.id)).order_by("id")
    assert [(r.worker_id, r.status) for r in rows] == [
        ("w0", "abandoned"),
        ("w1", "abandoned"),
        ("test-worker", "failed"),
    ]
    assert rows[2].error["gave_up"] is True
    # As written before the key existed: known by its message.
    legacy = {k: v for k, v in rows[2].error.items() if k != "gave_up"}
    for error in (rows[2].error, legacy):
        StepAttempt.objects.filter(pk=rows[2].pk).update(error=error)
        got = t.record.get_result(result.id)
        assert got.status == FAILED
        assert (got.attempts, got.worker_ids) == (2, ["w0", "w1"])
        assert got.last_attempted_at == rows[1].started_at
        [reason] = got.errors
        assert reason.exception_class_path == "tasks_engine.exceptions.StepFailedError"
        assert "interrupted 2 times without finishing" in reason.traceback
    assert effects("dies") == 0


@pytest.mark.parametrize(
    ("sent", "stored"), [(1e20, 10**20), (-1.5e17, -(15 * 10**16)), (-0.0, 0.0), (1e-07, 1e-07)]
)
def test_a_float_argument_reads_back_as_postgresql_stores_it_on_both_databases(
    fake_clock: FakeClock, sent: float, stored: float
) -> None:
    """PostgreSQL's jsonb keeps a number, not its notation: the argument 1e20 (Python writes
    1e+20) came back as the int 100000000000000000000 and -0.0 as 0.0 on PostgreSQL, while the
    worker's first call saw the float and SQLite kept it: a task's arguments, return value and
    a step's replayed result depended on the database. They are now the stored form at once."""
    result = t.add.enqueue(sent, 0)  # type: ignore[arg-type]
    assert drain(fake_clock) == ["completed"]
    got = t.add.get_result(result.id)
    for value in (result.args[0], got.args[0], got.return_value):
        assert (value, type(value), math.copysign(1, value)) == (
            stored,
            type(stored),
            math.copysign(1, stored),
        )


def test_task_finished_says_when_the_run_finished_on_the_engine_s_clock() -> None:
    """The worker's task_finished result took finished_at from timezone.now(), not the
    engine's clock: under the tester (a fake clock in 2030) the signal said the task
    finished today while get_result said 2030."""
    from django.tasks.signals import task_finished

    seen: list[Any] = []

    def on_finished(sender: Any, task_result: Any, **kw: Any) -> None:
        seen.append(task_result.finished_at)

    task_finished.connect(on_finished)
    try:
        with testing.WorkflowTester(start=datetime(2030, 1, 1, tzinfo=UTC)) as tester:
            ok, failed = t.add.enqueue(1, 2), t.boom.enqueue("late")
            tester.run_until_idle()
    finally:
        task_finished.disconnect(on_finished)
    assert seen == [t.add.get_result(ok.id).finished_at, t.boom.get_result(failed.id).finished_at]
