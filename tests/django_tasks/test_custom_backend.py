"""Ported from Django's tests/tasks/test_custom_backend.py (Django 6.1), on DurableBackend.

Django's tests define a minimal BaseTaskBackend subclass with an option of its own; here the
custom backend is DurableBackend with its own OPTIONS.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.tasks import default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from tasks_engine.backends import DurableBackend
from tests.testapp import ported_tasks as pt

from .config import BACKEND

OPTIONS = {"RETRY_INITIAL_INTERVAL": 0.5, "RETRY_MAX_INTERVAL": 5}


@pytest.fixture(autouse=True)
def _tasks_setting() -> Iterator[None]:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": OPTIONS}}):
        yield


def test_using_correct_backend() -> None:
    """CustomBackendTestCase.test_using_correct_backend."""
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DurableBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == OPTIONS


def test_enqueue_async_task_on_non_async_backend() -> None:
    """CustomBackendTestCase.test_enqueue_async_task_on_non_async_backend."""
    with (
        mock.patch.multiple(DurableBackend, supports_async_task=False),
        pytest.raises(InvalidTask, match=re.escape("Backend does not support async Tasks.")),
    ):
        default_task_backend.validate_task(pt.noop_task_async)


def test_backend_supports_priority() -> None:
    """CustomBackendTestCase.test_backend_does_not_support_priority, inverted: DurableBackend
    supports priorities, so `using(priority=10)` is valid."""
    assert default_task_backend.supports_priority is True
    assert pt.noop_task.using(priority=10).priority == 10


def test_options() -> None:
    """CustomBackendTestCase.test_options: the backend reads its OPTIONS."""
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert (backend.retry_interval, backend.retry_max_interval) == (0.5, 5.0)


def test_enqueue_is_implemented() -> None:
    """CustomBackendTestCase.test_no_enqueue, inverted: DurableBackend implements `enqueue`,
    so it is no abstract class and `using(backend=...)` can build it."""
    assert not DurableBackend.__abstractmethods__
    assert pt.noop_task.using(backend="default").get_backend() is task_backends["default"]


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"RETRY_INITIAL_INTERVAL": "1"}, "['RETRY_INITIAL_INTERVAL'] must be seconds (a number)"),
        ({"RETRY_MAX_INTERVAL": True}, "['RETRY_MAX_INTERVAL'] must be seconds (a number)"),
        ({"RETRY_MAX_INTERVAL": -1}, "['RETRY_MAX_INTERVAL'] must be 0 or more seconds"),
        ({"RETRY_INITIAL_INTERVAL": math.nan}, "['RETRY_INITIAL_INTERVAL'] must be 0 or more"),
    ],
    ids=["string", "bool", "negative", "nan"],
)
def test_check_reports_a_retry_option_that_is_no_duration(options: dict, text: str) -> None:
    """The RETRY_* options were read with float() (a string of digits passed, NaN and negative
    delays too, a word failed the backend's construction) and never checked."""
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        [error] = task_backends["default"].check()
    assert error.id == "tasks_engine.E013"
    assert error.msg.startswith("TASKS['default']['OPTIONS']") and text in error.msg


@pytest.mark.django_db
def test_manage_py_check_fails_on_a_retry_option_that_is_no_duration() -> None:
    bad = {"RETRY_INITIAL_INTERVAL": "soon"}
    with (
        override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": bad}}),
        pytest.raises(SystemCheckError, match=r"tasks_engine\.E013"),
    ):
        call_command("check")


@pytest.mark.parametrize(
    "options", [{}, OPTIONS, {"RETRY_INITIAL_INTERVAL": 0, "RETRY_MAX_INTERVAL": timedelta(1)}]
)
def test_check_accepts_retry_options_that_are_durations(options: dict[str, Any]) -> None:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "OPTIONS": options}}):
        assert task_backends["default"].check() == []
