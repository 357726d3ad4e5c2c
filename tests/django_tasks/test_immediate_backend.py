"""Ported from Django's tests/tasks/test_immediate_backend.py (Django 6.1), on DurableBackend.

ImmediateBackend runs a task inside `enqueue` and its tests assert right after. Here the cases
are enqueued first, one `runworker --burst` runs them all (`batch`), and each test asserts on
its case: the stored result read back with `get_result`, and what the worker's process sent
(`task_started`/`task_finished`) and logged (`django.tasks`). Assertions are Django's; where the
asynchronous backend changes the expected value, the test says so.
"""

from __future__ import annotations

import copy
import re
from functools import partial
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test import override_settings
from django.utils import timezone

from tasks_engine.backends import DurableBackend
from tests.testapp import ported_tasks as pt

from .batch import Batch, batch_fixture
from .config import BACKEND

pytestmark = pytest.mark.django_db

READY, RUNNING, SUCCESSFUL, FAILED = (
    TaskResultStatus.READY,
    TaskResultStatus.RUNNING,
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
)
FAILURES = [
    ("failing_task_value_error", ValueError, "This Task failed due to ValueError"),
    ("failing_task_system_exit", SystemExit, "This Task failed due to SystemExit"),
]


def _build(b: Batch) -> None:
    for name in ("noop_task", "noop_task_async"):
        t = getattr(pt, name)
        b.enqueue(f"enqueue:{name}", partial(t.enqueue, 1, two=3))
        b.enqueue(f"aenqueue:{name}", async_to_sync(t.aenqueue))
    for name, _, _ in FAILURES:
        b.enqueue(name, getattr(pt, name).enqueue)
    b.enqueue(
        "keyboard_interrupt",
        lambda: default_task_backend.enqueue(pt.failing_task_keyboard_interrupt, [], {}),
    )
    b.enqueue("complex_exception", pt.complex_exception.enqueue)
    b.enqueue("complex_return_value", pt.complex_return_value.enqueue)
    b.enqueue("result", lambda: default_task_backend.enqueue(pt.calculate_meaning_of_life, [], {}))
    b.enqueue(
        "result_async",
        lambda: async_to_sync(default_task_backend.aenqueue)(pt.calculate_meaning_of_life, [], {}),
    )
    b.enqueue(
        "refresh",
        lambda: async_to_sync(default_task_backend.aenqueue)(
            pt.calculate_meaning_of_life,
            (),  # type: ignore[arg-type]  # Django's test passes a tuple
            {},
        ),
    )
    b.enqueue("logs:noop", pt.noop_task.enqueue)
    b.enqueue("logs:failed", pt.failing_task_value_error.enqueue)
    b.enqueue("takes_context", pt.get_task_id.enqueue)
    b.enqueue("context", lambda: pt.context_matches.enqueue(1))
    with transaction.atomic():
        b.enqueue("atomic", pt.noop_task.enqueue)


batch = batch_fixture(_build, "--concurrency", "4")


def _assert_times(result: Any) -> None:
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


# -- ImmediateBackendTestCase --------------------------------------------------------------------


def test_using_correct_backend() -> None:
    """ImmediateBackendTestCase.test_using_correct_backend."""
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {}


@pytest.mark.process
@pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
def test_enqueue_task(batch: Batch, name: str) -> None:
    """ImmediateBackendTestCase.test_enqueue_task. Async: the result `enqueue` returns is
    READY; the worker's outcome is read back."""
    assert batch.cases[f"enqueue:{name}"].enqueued.status == READY
    result = batch.result(f"enqueue:{name}")
    assert result.status == SUCCESSFUL
    assert result.is_finished is True
    _assert_times(result)
    assert result.return_value is None
    assert result.task == getattr(pt, name)
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 1


@pytest.mark.process
@pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
def test_enqueue_task_async(batch: Batch, name: str) -> None:
    """ImmediateBackendTestCase.test_enqueue_task_async (`aenqueue()`)."""
    result = batch.result(f"aenqueue:{name}")
    assert result.status == SUCCESSFUL
    assert result.is_finished is True
    _assert_times(result)
    assert result.return_value is None
    assert result.task == getattr(pt, name)
    assert result.args == []
    assert result.kwargs == {}
    assert result.attempts == 1


@pytest.mark.process
@pytest.mark.parametrize(("name", "exception", "message"), FAILURES)
def test_catches_exception(
    batch: Batch, name: str, exception: type[BaseException], message: str
) -> None:
    """ImmediateBackendTestCase.test_catches_exception (ValueError and SystemExit): one ERROR
    record from django.tasks, logged by the worker's process."""
    [log] = batch.logs(name, "ERROR")
    assert message in log
    result = batch.result(name)
    assert result.status == FAILED
    with pytest.raises(ValueError, match=re.escape("Task failed")):
        _ = result.return_value
    assert result.is_finished is True
    _assert_times(result)
    assert result.errors[0].exception_class == exception
    traceback = result.errors[0].traceback
    assert traceback and traceback.endswith(f"{exception.__name__}: {message}\n"), traceback
    assert result.task == getattr(pt, name)
    assert result.args == []
    assert result.kwargs == {}


@pytest.mark.process
def test_throws_keyboard_interrupt(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_throws_keyboard_interrupt, adapted. ImmediateBackend lets
    KeyboardInterrupt propagate to the caller of `enqueue` (a user's Ctrl-C) and logs no ERROR.
    Here the caller's `enqueue` raises nothing and logs no ERROR either; in the worker the
    KeyboardInterrupt can only come from the task's code (the worker handles SIGINT itself),
    so it fails the task like any exception: FAILED, task_finished, one ERROR record."""
    case = batch.cases["keyboard_interrupt"]
    assert not [line for line in case.enqueue_logs if line.startswith("ERROR")]
    result = batch.result("keyboard_interrupt")
    assert result.status == FAILED
    assert result.errors[0].exception_class is KeyboardInterrupt
    assert result.errors[0].traceback.endswith(
        "KeyboardInterrupt: This Task failed due to KeyboardInterrupt\n"
    )
    assert batch.signals("keyboard_interrupt") == [("started", "RUNNING"), ("finished", "FAILED")]
    assert len(batch.logs("keyboard_interrupt", "ERROR")) == 1


@pytest.mark.process
def test_complex_exception(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_complex_exception."""
    assert len(batch.logs("complex_exception", "ERROR")) == 1
    result = batch.result("complex_exception")
    assert result.status == FAILED
    with pytest.raises(ValueError, match=re.escape("Task failed")):
        _ = result.return_value
    _assert_times(result)
    assert result._return_value is None  # type: ignore[attr-defined]
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert result.task == pt.complex_exception
    assert result.args == []
    assert result.kwargs == {}


@pytest.mark.process
def test_complex_return_value(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_complex_return_value: a lambda cannot be returned."""
    assert len(batch.logs("complex_return_value", "ERROR")) == 1
    result = batch.result("complex_return_value")
    assert result.status == FAILED
    _assert_times(result)
    assert result._return_value is None  # type: ignore[attr-defined]
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback
    assert batch.signals("complex_return_value") == [
        ("started", "RUNNING"),
        ("finished", "FAILED"),
    ]


@pytest.mark.process
def test_result(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_result (`backend.enqueue(task, [], {})`)."""
    result = batch.result("result")
    assert result.status == SUCCESSFUL
    assert result.return_value == 42


@pytest.mark.process
def test_result_async(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_result_async (`backend.aenqueue(task, [], {})`)."""
    result = async_to_sync(default_task_backend.aget_result)(
        batch.cases["result_async"].enqueued.id
    )
    assert result.status == SUCCESSFUL
    assert result.return_value == 42


def test_get_result_is_supported() -> None:
    """ImmediateBackendTestCase.test_cannot_get_result, inverted: DurableBackend supports
    `get_result` (supports_get_result), so an unknown id raises TaskResultDoesNotExist
    instead of NotImplementedError, for `get_result` and `aget_result` alike."""
    assert default_task_backend.supports_get_result is True
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(123)  # type: ignore[arg-type]


@pytest.mark.process
def test_refresh_result_is_supported(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_cannot_refresh_result, inverted: `arefresh()` and
    `refresh()` read the worker's outcome into a result `aenqueue` returned."""
    result = copy.copy(batch.cases["refresh"].enqueued)
    assert result.status == READY
    async_to_sync(result.arefresh)()
    assert (result.status, result.return_value) == (SUCCESSFUL, 42)
    result.refresh()
    assert (result.status, result.return_value) == (SUCCESSFUL, 42)


def test_run_after_is_supported() -> None:
    """ImmediateBackendTestCase.test_cannot_pass_run_after, inverted: DurableBackend supports
    `run_after` (supports_defer), so validation accepts it."""
    assert default_task_backend.supports_defer is True
    default_task_backend.validate_task(pt.failing_task_value_error.using(run_after=timezone.now()))


@pytest.mark.process
def test_enqueue_logs(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_enqueue_logs: three records; "enqueued" from the
    enqueuing process, state=RUNNING and state=SUCCESSFUL from the worker's."""
    case = batch.cases["logs:noop"]
    [enqueued] = case.enqueue_logs
    assert "enqueued" in enqueued and case.enqueued.id in enqueued
    running, successful = batch.logs("logs:noop")
    assert "state=RUNNING" in running
    assert "state=SUCCESSFUL" in successful


@pytest.mark.process
def test_failed_logs(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_failed_logs."""
    assert len(batch.cases["logs:failed"].enqueue_logs) == 1
    running, failed = batch.logs("logs:failed")
    assert "state=RUNNING" in running
    assert "state=FAILED" in failed


@pytest.mark.process
def test_successful_task_no_none_type_in_logs(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_successful_task_no_none_type_in_logs: no `exc_info`
    is logged for a success (the worker sends task_finished outside any handler)."""
    assert batch.result("logs:noop").status == SUCCESSFUL
    lines = [*batch.cases["logs:noop"].enqueue_logs, *batch.logs("logs:noop")]
    assert len(lines) == 3
    for line in lines:
        assert "NoneType" not in line


@pytest.mark.process
def test_takes_context(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_takes_context."""
    result = batch.result("takes_context")
    assert result.return_value == result.id


@pytest.mark.process
def test_context(batch: Batch) -> None:
    """ImmediateBackendTestCase.test_context: the context is a TaskContext, attempt 1."""
    assert batch.result("context").status == SUCCESSFUL


def _queue_checked_task() -> Any:
    """Django builds the task while QUEUES accepts any name, then enqueues it under stricter
    settings: `enqueue` validates again."""
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": []}}):
        return pt.noop_task.using(queue_name="unknown_queue")


def test_validate_on_enqueue() -> None:
    """ImmediateBackendTestCase.test_validate_on_enqueue (and DummyBackendTestCase's)."""
    task = _queue_checked_task()
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}),
        pytest.raises(
            InvalidTask, match=re.escape("Queue 'unknown_queue' is not valid for backend")
        ),
    ):
        task.enqueue()


def test_validate_on_aenqueue() -> None:
    """ImmediateBackendTestCase.test_validate_on_aenqueue (and DummyBackendTestCase's)."""
    task = _queue_checked_task()
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["queue-1"]}}),
        pytest.raises(
            InvalidTask, match=re.escape("Queue 'unknown_queue' is not valid for backend")
        ),
    ):
        async_to_sync(task.aenqueue)()


# -- ImmediateBackendTransactionTestCase ---------------------------------------------------------


@pytest.mark.process
def test_doesnt_wait_until_transaction_commit_by_default(batch: Batch) -> None:
    """ImmediateBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default
    (and DummyBackendTransactionTestCase's), adapted: `enqueue` inside `atomic()` writes the run
    at once (enqueued_at is set inside the transaction); it is READY there, not SUCCESSFUL,
    because a worker runs it only once the transaction commits; task_enqueued waits for the
    commit too. After the commit, the worker ran it."""
    case = batch.cases["atomic"]
    assert case.enqueued.enqueued_at is not None
    assert case.enqueued.status == READY
    assert case.enqueued_signals == 0
    assert batch.result("atomic").status == SUCCESSFUL
