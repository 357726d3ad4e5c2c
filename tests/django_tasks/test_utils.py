"""Ported from Django's tests/tasks/test_utils.py, as the behaviours reach a backend.

Django's test_utils tests helpers (module-level function detection, JSON normalization,
tracebacks of errors) directly; here each is checked where DurableBackend relies on it:
validating a task, and storing its arguments. The traceback cases need a worker and are in
test_documented.py; RetryTestCase tests a helper of django-tasks' database backend that
DurableBackend has no use for and is not ported.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from django.tasks import task
from django.tasks.exceptions import InvalidTask

from tests.testapp import ported_tasks as pt

pytestmark = pytest.mark.django_db

NOT_MODULE_LEVEL = "Task function must be defined at a module level."


def _private() -> Callable[[], None]:
    def private_function() -> None:
        pass

    return private_function


def _lambda() -> Callable[[], bool]:
    return lambda: True  # as in Django's test, made inside a function


class _Holder:
    def method(self) -> None:
        pass


@pytest.mark.parametrize(
    "function",
    [any, isinstance, _private(), _Holder().method, _lambda()],
    ids=["builtin", "builtin-2", "private", "method", "lambda"],
)
def test_not_module_level_functions_are_refused(function: Any) -> None:
    """IsModuleLevelFunctionTestCase.test_builtin, test_private_function, test_method and
    test_lambda: DurableBackend refuses such a function as a task."""
    with pytest.raises(InvalidTask, match=re.escape(NOT_MODULE_LEVEL)):
        task()(function)


@pytest.mark.parametrize(
    "function",
    [subprocess.run, subprocess.check_output, pt.noop_task.func, pt.noop_task_async.func],
    ids=["run", "check_output", "noop", "coroutine"],
)
def test_module_level_functions_are_accepted(function: Any) -> None:
    """IsModuleLevelFunctionTestCase.test_from_module and test_coroutine."""
    assert task()(function).func is function


def test_round_trip() -> None:
    """JSONNormalizeTestCase.test_round_trip: arguments are stored as JSON, so tuples come back
    as lists, and empty containers stay what they are."""
    result = pt.echo.enqueue({}, [], (), foo=())
    assert result.args == [{}, [], []]
    assert result.kwargs == {"foo": []}
    assert pt.echo.get_result(result.id).args == [{}, [], []]


class _Unserializable:
    pass


@pytest.mark.parametrize(
    "value",
    [_Unserializable(), any, datetime.datetime.now()],
    ids=["object", "builtin", "datetime"],
)
def test_encode_error(value: Any) -> None:
    """JSONNormalizeTestCase.test_encode_error: `enqueue` raises TypeError."""
    with pytest.raises(TypeError):
        pt.noop_task.enqueue(value)
