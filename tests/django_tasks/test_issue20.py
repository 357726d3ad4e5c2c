"""Issue 20: where DurableBackend failed the port of Django's tasks tests, one test (or more)
per defect, each failing before its fix in tasks_engine/backends.py.

1. SystemExit / KeyboardInterrupt: task_finished and the ERROR record were missing.
2. A return value JSON cannot hold (NUL, NaN, ±Infinity) poisoned the group commit.
3. NaN / ±Infinity arguments were stored as null, a NUL raised DataError from `enqueue`.
4. `get_result(...).task` was rebuilt with the "default" alias whatever the run's alias.
5. Without QUEUES any queue name was accepted, where Django's backends accept "default".
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from tasks_engine import backends
from tasks_engine.backends import DJANGO_TASK, DurableBackend
from tasks_engine.exceptions import UnstorableValueError
from tasks_engine.models import WorkflowRun
from tests.testapp import ported_tasks as pt
from tests.testapp.models import SideEffect

from .batch import Batch, batch_fixture
from .config import BACKEND

pytestmark = pytest.mark.django_db

SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
QUEUE_MAX_LENGTH = WorkflowRun._meta.get_field("queue").max_length or 0
UNSTORABLE = ["nul", "nan", "inf"]
UNRELATED = 24


def _build(b: Batch) -> None:
    # Unstorable return values among many unrelated runs, so that on PostgreSQL their writes
    # share the worker's group commits (8 slots).
    for i in range(UNRELATED):
        b.enqueue(f"unrelated:{i}", partial(pt.echo.enqueue, i, tag="unrelated"))
        if i % 8 == 0:
            kind = UNSTORABLE[i // 8]
            b.enqueue(f"returns:{kind}", partial(pt.returns.enqueue, kind))
    b.enqueue(
        "returns:retrying",
        lambda: pt.returns.using(max_attempts=3).enqueue("nan"),  # type: ignore[call-arg]
    )
    b.enqueue("system_exit", pt.failing_task_system_exit.enqueue)
    b.enqueue("keyboard_interrupt", pt.failing_task_keyboard_interrupt.enqueue)
    b.enqueue("exit_task", pt.exit_task.using(max_attempts=3).enqueue)  # type: ignore[call-arg]
    b.enqueue("other_alias", lambda: pt.calculate_meaning_of_life.using(backend="other").enqueue())


batch = batch_fixture(_build, "--concurrency", "8")


# -- 1. SystemExit and KeyboardInterrupt --------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize(
    ("name", "exception"),
    [("system_exit", "builtins.SystemExit"), ("keyboard_interrupt", "builtins.KeyboardInterrupt")],
)
def test_exit_exceptions_send_task_finished_and_log_an_error(
    batch: Batch, name: str, exception: str
) -> None:
    result = batch.result(name)
    assert result.status == FAILED
    assert [e.exception_class_path for e in result.errors] == [exception]
    started, finished = batch.worker_records(name)
    assert (started["kind"], started["status"]) == ("started", "RUNNING")
    assert (finished["kind"], finished["status"], finished["errors"]) == (
        "finished",
        "FAILED",
        [exception],
    )
    [log] = batch.logs(name, "ERROR")
    assert "state=FAILED" in log
    assert f"{exception.removeprefix('builtins.')}: This Task failed due to" in log  # exc_info


@pytest.mark.process
def test_exit_fails_at_once_even_with_attempts_left(batch: Batch) -> None:
    """`exit(1)` in a task with max_attempts=3: SystemExit asks to stop, not to try again."""
    result = batch.result("exit_task")
    assert result.status == FAILED
    assert result.attempts == 1
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]
    assert batch.signals("exit_task") == [("started", "RUNNING"), ("finished", "FAILED")]


# -- 2. return values JSON cannot hold ----------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("kind", UNSTORABLE)
def test_an_unstorable_return_value_fails_the_task_alone(batch: Batch, kind: str) -> None:
    result = batch.result(f"returns:{kind}")
    assert result.status == FAILED
    [error] = result.errors
    assert error.exception_class is UnstorableValueError
    assert (
        "UnstorableValueError: the return value of tests.testapp.ported_tasks.returns "
        "cannot be stored as JSON" in error.traceback
    )
    # Never SUCCESSFUL first: the value is refused before the worker says anything.
    assert batch.signals(f"returns:{kind}") == [("started", "RUNNING"), ("finished", "FAILED")]
    [log] = batch.logs(f"returns:{kind}", "ERROR")
    assert "state=FAILED" in log


@pytest.mark.process
def test_an_unstorable_return_value_is_not_retried(batch: Batch) -> None:
    """The task ran and its side effects happened: running it again would not store it."""
    result = batch.result("returns:retrying")
    assert (result.status, result.attempts) == (FAILED, 1)
    assert result.errors[0].exception_class is UnstorableValueError


@pytest.mark.process
def test_unrelated_tasks_are_unaffected(batch: Batch) -> None:
    results = [batch.result(f"unrelated:{i}") for i in range(UNRELATED)]
    assert [r.status for r in results] == [SUCCESSFUL] * UNRELATED
    assert [r.return_value for r in results] == [
        {"args": [i], "kwargs": {"tag": "unrelated"}} for i in range(UNRELATED)
    ]
    for i in range(UNRELATED):
        assert batch.signals(f"unrelated:{i}") == [
            ("started", "RUNNING"),
            ("finished", "SUCCESSFUL"),
        ]


# -- 3. arguments JSON cannot hold --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "why"),
    [
        ((math.nan,), {}, "the float nan at ['args'][0]"),
        ((math.inf,), {}, "the float inf at ['args'][0]"),
        ((), {"low": -math.inf}, "the float -inf at ['kwargs']['low']"),
        (("a\x00b",), {}, "a string with a NUL character at ['args'][0]"),
        ((), {"deep": {"list": [1.0, math.nan]}}, "at ['kwargs']['deep']['list'][1]"),
        (({"key\x00": 1},), {}, "a key with a NUL character"),
    ],
    ids=["nan", "inf", "-inf", "nul", "nested", "nul-key"],
)
def test_unstorable_arguments_are_refused_at_enqueue(
    args: tuple[Any, ...], kwargs: dict[str, Any], why: str
) -> None:
    stored = WorkflowRun.objects.filter(task_name=DJANGO_TASK).count()
    for enqueue in (pt.echo.enqueue, async_to_sync(pt.echo.aenqueue)):
        with pytest.raises(UnstorableValueError) as raised:
            enqueue(*args, **kwargs)
        message = str(raised.value)
        assert message.startswith(
            "the arguments of tests.testapp.ported_tasks.echo cannot be stored as JSON"
        )
        assert why in message
        # A TypeError like Django's "Unsupported type", and a ValueError like its bytes error.
        assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)
    assert WorkflowRun.objects.filter(task_name=DJANGO_TASK).count() == stored  # none written


def test_storable_floats_and_strings_are_kept() -> None:
    text = "tab\tand \u2028 and \\u0000 (six characters, no NUL)"
    result = pt.echo.enqueue(0.1, 12345.678, 1.0, text, key=5e-324)
    stored = pt.echo.get_result(result.id)
    assert stored.args == [0.1, 12345.678, 1.0, text]
    assert [type(a) for a in stored.args] == [float, float, float, str]
    assert stored.kwargs == {"key": 5e-324}
    # PostgreSQL's jsonb keeps numbers as `numeric`: a float written with an exponent reads
    # back as the same number, an int when it is integral (README: remaining deviations).
    huge = pt.echo.get_result(pt.echo.enqueue(1e20).id).args[0]
    assert huge == 1e20  # 100000000000000000000 on PostgreSQL


@pytest.mark.django_db(transaction=True)
def test_a_refused_enqueue_leaves_the_callers_transaction_usable() -> None:
    """A NUL once reached PostgreSQL and aborted the caller's transaction (DataError)."""
    before = set(WorkflowRun.objects.values_list("pk", flat=True))
    with transaction.atomic():
        SideEffect.objects.create(key="before")
        with pytest.raises(UnstorableValueError):
            pt.echo.enqueue("a\x00b")
        with pytest.raises(UnstorableValueError):
            pt.echo.enqueue(math.nan)
        SideEffect.objects.create(key="after")
        kept = pt.echo.enqueue("fine")
    assert sorted(
        SideEffect.objects.filter(key__in=["before", "after"]).values_list("key", flat=True)
    ) == ["after", "before"]
    new = WorkflowRun.objects.exclude(pk__in=before).values_list("pk", flat=True)
    assert [str(pk) for pk in new] == [kept.id]


# -- 4. the alias a result is read back with -----------------------------------------------------


def test_get_result_rebuilds_the_task_with_the_alias_it_was_enqueued_with() -> None:
    other = pt.noop_task.using(backend="other")
    result = other.enqueue()
    assert (result.backend, result.task.backend) == ("other", "other")
    for backend in (task_backends["other"], default_task_backend):
        got = backend.get_result(result.id)
        assert (got.backend, got.task.backend) == ("other", "other")
        assert got.task.get_backend() is task_backends["other"]
    assert other.get_result(result.id) == result
    result.refresh()  # through the "other" backend
    assert result.task == other


def test_a_stored_run_reads_back_after_its_settings_changed() -> None:
    """Rebuilt as enqueued, without validating against today's TASKS: a queue the alias no
    longer accepts, an alias that is gone (then the reading backend's alias is used)."""
    result = pt.noop_task.using(backend="other", queue_name="reports").enqueue()
    assert pt.noop_task.get_result(result.id).task.queue_name == "reports"
    only_default = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    with override_settings(TASKS=only_default):
        got = pt.noop_task.get_result(result.id)
        assert (got.backend, got.task.backend, got.task.queue_name) == (
            "default",
            "default",
            "reports",
        )


@pytest.mark.process
def test_the_worker_runs_a_task_through_its_alias(batch: Batch) -> None:
    result = batch.result("other_alias")
    assert (result.status, result.return_value) == (SUCCESSFUL, 42)
    assert (result.backend, result.task.backend) == ("other", "other")
    for record in batch.worker_records("other_alias"):
        assert (record["backend"], record["task_backend"]) == ("other", "other")


# -- 5. QUEUES ------------------------------------------------------------------------------------


def test_without_queues_only_the_default_queue_is_accepted() -> None:
    """Django's default: no QUEUES means {"default"}."""
    with override_settings(TASKS={"default": {"BACKEND": BACKEND}}):
        assert default_task_backend.queues == {"default"}
        with pytest.raises(
            InvalidTask, match=re.escape("Queue 'reports' is not valid for backend.")
        ):
            pt.noop_task.using(queue_name="reports")
        assert pt.noop_task.enqueue().task.queue_name == "default"


def test_configured_queues_are_accepted_and_stored() -> None:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["default", "rx"]}}):
        result = pt.noop_task.using(queue_name="rx").enqueue()
        assert WorkflowRun.objects.get(pk=result.id).queue == "rx"
        assert result.task.queue_name == "rx"


def test_the_backend_knows_the_queue_column_length() -> None:
    assert backends.QUEUE_MAX_LENGTH == QUEUE_MAX_LENGTH == 100


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("", "queue_name must be a non-empty string"),
        ("q" * (QUEUE_MAX_LENGTH + 1), "queue_name is 101 characters long: at most 100"),
        ("a\x00b", "queue_name must not contain a NUL character"),  # was enqueue's ValueError
    ],
    ids=["empty", "too-long", "nul"],
)
def test_a_queue_name_no_run_can_be_stored_under_is_invalid(queue: str, message: str) -> None:
    """With QUEUES [] any name passes Django's check; the engine's column still bounds it (a
    longer name would fail the INSERT on PostgreSQL and abort the caller's transaction)."""
    with pytest.raises(InvalidTask, match=re.escape(message)):
        pt.noop_task.using(backend="other", queue_name=queue)
    assert pt.noop_task.using(backend="other", queue_name="q" * QUEUE_MAX_LENGTH).enqueue()


@pytest.mark.parametrize(
    ("queues", "check_id", "text"),
    [
        ("emails", "tasks_engine.E011", "must be a list of queue names, not str 'emails'"),
        (42, "tasks_engine.E011", "must be a list of queue names, not int 42"),
        (["default", ""], "tasks_engine.E012", "holds names no run can be stored under: ''"),
        (["a\x00b"], "tasks_engine.E012", "holds names no run can be stored under: 'a\\x00b'"),
        (
            ["q" * (QUEUE_MAX_LENGTH + 1)],
            "tasks_engine.E012",
            "holds names no run can be stored under: 'qqq",
        ),
    ],
    ids=["string", "int", "empty-name", "nul", "too-long"],
)
def test_check_reports_queues_no_run_can_use(queues: Any, check_id: str, text: str) -> None:
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": queues}}):
        backend = task_backends["default"]
        assert isinstance(backend, DurableBackend)
        [error] = backend.check()
    assert error.id == check_id
    assert f"TASKS['default']['QUEUES'] {text}" in error.msg


def test_a_queues_setting_that_is_no_list_counts_as_absent() -> None:
    """A bare string would be a set of letters to Django; the check reports it (E011)."""
    with override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": "emails"}}):
        assert default_task_backend.queues == {"default"}


@pytest.mark.parametrize("queues", [None, [], ["default", "emails"]], ids=["absent", "any", "list"])
def test_check_accepts_usable_queues(queues: Any) -> None:
    params: dict[str, Any] = {"BACKEND": BACKEND}
    if queues is not None:
        params["QUEUES"] = queues
    with override_settings(TASKS={"default": params}):
        assert task_backends["default"].check() == []
