"""Ported from Django's tests/tasks/test_tasks.py (TaskTestCase, Django 6.1), on DurableBackend.

Django runs these with DummyBackend as "default" (QUEUES ["default", "queue_1"]), an
ImmediateBackend alias accepting any queue, and an alias whose backend does not import. Here
"default" and "other" are DurableBackends with those QUEUES. No worker is needed: a task is
enqueued, read back and compared. `test_task_error_invalid_exception` and
`test_task_error_unknown_module` need a failed task and live in test_documented.py.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.tasks import (
    DEFAULT_TASK_QUEUE_NAME,
    Task,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
)
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string

from tasks_engine.backends import DJANGO_TASK, DurableBackend, DurableTask
from tasks_engine.models import WorkflowRun
from tests.testapp import ported_tasks as pt

from .config import BACKEND

pytestmark = pytest.mark.django_db

TASKS = {
    "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]},
    "other": {"BACKEND": BACKEND, "QUEUES": []},
    "missing": {"BACKEND": "does.not.exist"},
}
PRIORITY_MESSAGE = (
    f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}."
)


@pytest.fixture(autouse=True)
def _tasks_setting() -> Iterator[None]:
    with override_settings(TASKS=TASKS, USE_TZ=True):
        yield


def _stored_ids() -> list[str]:
    """DummyBackend's `results`, as ids: the Django task runs stored."""
    runs = WorkflowRun.objects.filter(task_name=DJANGO_TASK).order_by("created_at")
    return [str(pk) for pk in runs.values_list("pk", flat=True)]


def test_using_correct_backend() -> None:
    """TaskTestCase.test_using_correct_backend."""
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)


def test_task_decorator() -> None:
    """TaskTestCase.test_task_decorator (DurableBackend's task_class is a Task)."""
    for t in (pt.noop_task, pt.noop_task_async, pt.noop_task_from_bare_decorator):
        assert isinstance(t, Task)
        assert isinstance(t, DurableTask)


def test_enqueue_task() -> None:
    """TaskTestCase.test_enqueue_task."""
    result = pt.noop_task.enqueue()
    assert result.status == TaskResultStatus.READY
    assert result.task == pt.noop_task
    assert result.args == []
    assert result.kwargs == {}
    assert _stored_ids() == [result.id]
    assert default_task_backend.get_result(result.id) == result


def test_enqueue_task_async() -> None:
    """TaskTestCase.test_enqueue_task_async."""
    result = async_to_sync(pt.noop_task.aenqueue)()
    assert result.status == TaskResultStatus.READY
    assert result.task == pt.noop_task
    assert result.args == []
    assert result.kwargs == {}
    assert _stored_ids() == [result.id]


def test_enqueue_with_invalid_argument() -> None:
    """TaskTestCase.test_enqueue_with_invalid_argument: nothing is stored either."""
    with pytest.raises(TypeError, match=re.escape("Unsupported type")):
        pt.noop_task.enqueue(datetime.now())
    assert _stored_ids() == []


def test_aenqueue_with_invalid_argument() -> None:
    """TaskTestCase.test_aenqueue_with_invalid_argument."""
    with pytest.raises(TypeError, match=re.escape("Unsupported type")):
        async_to_sync(pt.noop_task.aenqueue)(datetime.now())


def test_using_priority() -> None:
    """TaskTestCase.test_using_priority."""
    assert pt.noop_task.priority == 0
    assert pt.noop_task.using(priority=1).priority == 1
    assert pt.noop_task.priority == 0


def test_using_queue_name() -> None:
    """TaskTestCase.test_using_queue_name."""
    assert pt.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME
    assert pt.noop_task.using(queue_name="queue_1").queue_name == "queue_1"
    assert pt.noop_task.queue_name == DEFAULT_TASK_QUEUE_NAME


def test_using_run_after() -> None:
    """TaskTestCase.test_using_run_after."""
    now = timezone.now()
    assert pt.noop_task.run_after is None
    assert pt.noop_task.using(run_after=now).run_after == now
    assert pt.noop_task.run_after is None


def test_using_unknown_backend() -> None:
    """TaskTestCase.test_using_unknown_backend."""
    assert pt.noop_task.backend == "default"
    with pytest.raises(
        InvalidTaskBackend, match=re.escape("The connection 'unknown' doesn't exist.")
    ):
        pt.noop_task.using(backend="unknown")


def test_using_missing_backend() -> None:
    """TaskTestCase.test_using_missing_backend."""
    assert pt.noop_task.backend == "default"
    with pytest.raises(
        InvalidTaskBackend,
        match=re.escape("Could not find backend 'does.not.exist': No module named 'does'"),
    ):
        pt.noop_task.using(backend="missing")


def test_using_creates_new_instance() -> None:
    """TaskTestCase.test_using_creates_new_instance (DurableTask overrides `using`)."""
    new_task = pt.noop_task.using()
    assert new_task == pt.noop_task
    assert new_task is not pt.noop_task


def test_chained_using() -> None:
    """TaskTestCase.test_chained_using."""
    now = timezone.now()
    run_after_task = pt.noop_task.using(run_after=now)
    assert run_after_task.run_after == now
    priority_task = run_after_task.using(priority=10)
    assert priority_task.priority == 10
    assert priority_task.run_after == now
    assert run_after_task.priority == 0


def test_refresh_result() -> None:
    """TaskTestCase.test_refresh_result: refreshing an unchanged result changes nothing."""
    result = async_to_sync(pt.noop_task.aenqueue)()
    original = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original


def test_naive_datetime() -> None:
    """TaskTestCase.test_naive_datetime."""
    with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
        pt.noop_task.using(run_after=datetime.now())


@pytest.mark.parametrize("priority", [-101, 101, 3.1])
def test_invalid_priority(priority: float) -> None:
    """TaskTestCase.test_invalid_priority."""
    with pytest.raises(InvalidTask, match=re.escape(PRIORITY_MESSAGE)):
        pt.noop_task.using(priority=priority)  # type: ignore[arg-type]


def test_valid_priority_bounds() -> None:
    """TaskTestCase.test_invalid_priority (its closing lines: the bounds are accepted)."""
    for priority in (100, -100, 0):
        pt.noop_task.using(priority=priority)


def test_unknown_queue_name() -> None:
    """TaskTestCase.test_unknown_queue_name: QUEUES is checked; an empty QUEUES accepts any."""
    with pytest.raises(InvalidTask, match=re.escape("Queue 'queue-2' is not valid for backend.")):
        pt.noop_task.using(queue_name="queue-2")
    assert pt.noop_task.using(queue_name="queue-2", backend="other").queue_name == "queue-2"


def test_call_task() -> None:
    """TaskTestCase.test_call_task."""
    assert pt.calculate_meaning_of_life.call() == 42


def test_call_task_async() -> None:
    """TaskTestCase.test_call_task_async."""
    assert async_to_sync(pt.calculate_meaning_of_life.acall)() == 42


def test_call_async_task() -> None:
    """TaskTestCase.test_call_async_task."""
    assert async_to_sync(pt.noop_task_async.acall)() is None


def test_call_async_task_sync() -> None:
    """TaskTestCase.test_call_async_task_sync."""
    assert pt.noop_task_async.call() is None


def test_get_result() -> None:
    """TaskTestCase.test_get_result."""
    result = default_task_backend.enqueue(pt.noop_task, (), {})  # type: ignore[arg-type]
    assert pt.noop_task.get_result(result.id) == result


def test_get_result_async() -> None:
    """TaskTestCase.test_get_result_async."""
    result = async_to_sync(default_task_backend.aenqueue)(pt.noop_task, (), {})  # type: ignore[arg-type]
    assert async_to_sync(pt.noop_task.aget_result)(result.id) == result


def test_get_missing_result() -> None:
    """TaskTestCase.test_get_missing_result."""
    with pytest.raises(TaskResultDoesNotExist):
        pt.noop_task.get_result("123")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(pt.noop_task.aget_result)("123")


def test_get_incorrect_result() -> None:
    """TaskTestCase.test_get_incorrect_result."""
    result = default_task_backend.enqueue(pt.noop_task_async, (), {})  # type: ignore[arg-type]
    with pytest.raises(TaskResultMismatch, match=re.escape("Task does not match")):
        pt.noop_task.get_result(result.id)


def test_get_incorrect_result_async() -> None:
    """TaskTestCase.test_get_incorrect_result_async."""
    result = async_to_sync(default_task_backend.aenqueue)(pt.noop_task_async, (), {})  # type: ignore[arg-type]
    with pytest.raises(TaskResultMismatch, match=re.escape("Task does not match")):
        async_to_sync(pt.noop_task.aget_result)(result.id)


class _Holder:
    def method(self) -> None:
        pass


@pytest.mark.parametrize("function", [any, _Holder().method], ids=["builtin", "method"])
def test_invalid_function(function: Any) -> None:
    """TaskTestCase.test_invalid_function."""
    with pytest.raises(
        InvalidTask, match=re.escape("Task function must be defined at a module level.")
    ):
        task()(function)


def test_get_backend() -> None:
    """TaskTestCase.test_get_backend ("other" stands for Django's "immediate" alias)."""
    assert pt.noop_task.backend == "default"
    assert isinstance(pt.noop_task.get_backend(), DurableBackend)
    other_task = pt.noop_task.using(backend="other")
    assert other_task.backend == "other"
    assert other_task.get_backend() is task_backends["other"]


def test_name() -> None:
    """TaskTestCase.test_name."""
    assert pt.noop_task.name == "noop_task"
    assert pt.noop_task_async.name == "noop_task_async"


def test_module_path() -> None:
    """TaskTestCase.test_module_path: the path workers import the task by."""
    assert pt.noop_task.module_path == "tests.testapp.ported_tasks.noop_task"
    assert pt.noop_task_async.module_path == "tests.testapp.ported_tasks.noop_task_async"
    assert import_string(pt.noop_task.module_path) is pt.noop_task
    assert import_string(pt.noop_task_async.module_path) is pt.noop_task_async


def test_pickle_task() -> None:
    """TaskTestCase.test_pickle_task (a DurableTask's own fields go along)."""
    assert pickle.loads(pickle.dumps(pt.noop_task)) == pt.noop_task
    twice = pt.noop_task.using(max_attempts=2)  # type: ignore[call-arg]
    assert pickle.loads(pickle.dumps(twice)) == twice


def test_unpickle_arbitrary_string() -> None:
    """TaskTestCase.test_unpickle_arbitrary_string."""
    message = "Expected 'does.not.exist.fake_task' to point to a Task instance."
    with pytest.raises(ValueError, match=message):
        Task._reconstruct({"func": "does.not.exist.fake_task"})  # type: ignore[attr-defined]


def test_unpickle_non_task_object() -> None:
    """TaskTestCase.test_unpickle_non_task_object."""
    with pytest.raises(
        ValueError, match=re.escape("Expected 'builtins.any' to point to a Task instance.")
    ):
        Task._reconstruct({"func": "builtins.any"})  # type: ignore[attr-defined]


def test_pickle_task_result() -> None:
    """TaskTestCase.test_pickle_task_result."""
    result = pt.noop_task.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result


def test_no_backends() -> None:
    """TaskTestCase.test_no_backends."""
    with override_settings(TASKS={}), pytest.raises(InvalidTaskBackend):
        pt.noop_task.enqueue()


def test_takes_context_without_taking_context() -> None:
    """TaskTestCase.test_takes_context_without_taking_context."""
    with pytest.raises(
        InvalidTask,
        match=re.escape("Task takes context but does not have a first argument of 'context'."),
    ):
        task(takes_context=True)(pt.calculate_meaning_of_life.func)


def test_run_after_in_decorator() -> None:
    """TaskTestCase.test_run_after_in_decorator."""
    with pytest.raises(
        TypeError,
        match=re.escape("run_after cannot be defined statically with the @task decorator."),
    ):
        task(run_after=timezone.now())(  # type: ignore[call-overload]
            pt.calculate_meaning_of_life.func
        )
