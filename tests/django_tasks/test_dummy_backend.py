"""Ported from Django's tests/tasks/test_dummy_backend.py (Django 6.1), on DurableBackend.

DummyBackend keeps enqueued results in memory and never runs them: its tests are about a
result before any worker ran it, which DurableBackend gives with no worker started. Where
Django reads or changes `backend.results`, these read or change the stored run.
`test_validate_on_enqueue`, `test_validate_on_aenqueue` and the transaction test are ported
with their ImmediateBackend twins in test_immediate_backend.py.
"""

from __future__ import annotations

import re
from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from tasks_engine.backends import DurableBackend
from tasks_engine.models import WorkflowRun
from tests.testapp import ported_tasks as pt

from .batch import capture_task_logs

pytestmark = pytest.mark.django_db

READY, SUCCESSFUL = TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL


def _store_success(result_id: str, value: Any) -> None:
    """What a worker writes when the task returns `value` (DummyBackend's tests set the
    stored result's status by hand)."""
    WorkflowRun.objects.filter(pk=result_id).update(status="completed", output=value)


def test_using_correct_backend() -> None:
    """DummyBackendTestCase.test_using_correct_backend."""
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {}


@pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
def test_enqueue_task(name: str) -> None:
    """DummyBackendTestCase.test_enqueue_task; "in backend.results" becomes "stored"."""
    task = getattr(pt, name)
    result = task.enqueue(1, two=3)
    assert result.status == READY
    assert result.is_finished is False
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    with pytest.raises(ValueError, match=re.escape("Task has not finished yet")):
        _ = result.return_value
    assert result.task == task
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 0
    assert default_task_backend.get_result(result.id) == result


@pytest.mark.parametrize("name", ["noop_task", "noop_task_async"])
def test_enqueue_task_async(name: str) -> None:
    """DummyBackendTestCase.test_enqueue_task_async."""
    task = getattr(pt, name)
    result = async_to_sync(task.aenqueue)()
    assert result.status == READY
    assert result.is_finished is False
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    with pytest.raises(ValueError, match=re.escape("Task has not finished yet")):
        _ = result.return_value
    assert result.task == task
    assert result.args == []
    assert result.kwargs == {}
    assert result.attempts == 0
    assert default_task_backend.get_result(result.id) == result


def test_get_result() -> None:
    """DummyBackendTestCase.test_get_result."""
    result = default_task_backend.enqueue(pt.noop_task, (), {})  # type: ignore[arg-type]
    assert default_task_backend.get_result(result.id) == result


def test_get_result_async() -> None:
    """DummyBackendTestCase.test_get_result_async."""
    result = async_to_sync(default_task_backend.aenqueue)(pt.noop_task, (), {})  # type: ignore[arg-type]
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result


def test_refresh_result() -> None:
    """DummyBackendTestCase.test_refresh_result: the store changes, `refresh()` reads it."""
    result = default_task_backend.enqueue(pt.calculate_meaning_of_life, (), {})  # type: ignore[arg-type]
    _store_success(result.id, 42)
    assert result.status == READY
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.return_value == 42


def test_refresh_result_async() -> None:
    """DummyBackendTestCase.test_refresh_result_async."""
    result = async_to_sync(default_task_backend.aenqueue)(pt.calculate_meaning_of_life, (), {})  # type: ignore[arg-type]
    _store_success(result.id, 42)
    assert result.status == READY
    async_to_sync(result.arefresh)()
    assert result.status == SUCCESSFUL


def test_get_missing_result() -> None:
    """DummyBackendTestCase.test_get_missing_result (also a well-formed id no run has)."""
    for missing in ("123", "00000000-0000-0000-0000-000000000000"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(missing)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(default_task_backend.aget_result)(missing)


def test_enqueue_logs(django_capture_on_commit_callbacks: Any) -> None:
    """DummyBackendTestCase.test_enqueue_logs: one DEBUG record, once the enqueue commits."""
    with capture_task_logs() as lines, django_capture_on_commit_callbacks(execute=True):
        result = pt.noop_task.enqueue()
    [line] = lines
    assert "enqueued" in line
    assert result.id in line


def test_errors() -> None:
    """DummyBackendTestCase.test_errors."""
    assert pt.noop_task.enqueue().errors == []


def test_validate_disallowed_async_task() -> None:
    """DummyBackendTestCase.test_validate_disallowed_async_task."""
    with (
        mock.patch.multiple(default_task_backend, supports_async_task=False),
        pytest.raises(InvalidTask, match=re.escape("Backend does not support async Tasks.")),
    ):
        default_task_backend.validate_task(pt.noop_task_async)


def test_check() -> None:
    """DummyBackendTestCase.test_check."""
    errors = list(default_task_backend.check())
    assert errors == []


def test_takes_context() -> None:
    """DummyBackendTestCase.test_takes_context."""
    assert pt.get_task_id.enqueue().status == READY


def test_clear() -> None:
    """DummyBackendTestCase.test_clear, adapted: DurableBackend has no `clear()`; a result
    whose run was deleted (`manage.py tasks prune`, the admin) is gone the same way."""
    result = pt.noop_task.enqueue()
    default_task_backend.get_result(result.id)
    WorkflowRun.objects.filter(pk=result.id).delete()
    with pytest.raises(TaskResultDoesNotExist, match=re.escape(result.id)):
        default_task_backend.get_result(result.id)
