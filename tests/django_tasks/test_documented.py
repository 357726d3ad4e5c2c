"""What Django's documentation promises of a tasks backend (docs/topics/tasks.txt,
docs/ref/tasks.txt, the task signals in docs/ref/signals.txt), checked on DurableBackend with
a real worker; and the ported tests that need a task to have failed or run:
test_tasks.py's TaskError tests and test_utils.py's traceback tests.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from django.db import transaction
from django.tasks import TaskResult, TaskResultStatus, default_task_backend
from django.tasks.signals import task_enqueued

from tasks_engine.models import WorkflowRun
from tests.testapp import ported_tasks as pt
from tests.testapp.models import SideEffect

from .batch import BATCH_PREFIX, Batch, batch_fixture, wait_for_status

pytestmark = pytest.mark.django_db

RUNNING, SUCCESSFUL, FAILED = (
    TaskResultStatus.RUNNING,
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
)
THING = f"{BATCH_PREFIX}thing"  # a row the enqueuing transaction writes
OTHER_THING = f"{BATCH_PREFIX}other-thing"
RELEASE = f"{BATCH_PREFIX}running"


def _runs_of(path: str) -> list[str]:
    runs = WorkflowRun.objects.filter(input__task=path).order_by("created_at")
    return [str(pk) for pk in runs.values_list("pk", flat=True)]


def _enqueue_on_commit() -> TaskResult:
    """docs "Transactions": enqueue with `transaction.on_commit(partial(task.enqueue, ...))`."""
    path = pt.read_side_effect.module_path
    with transaction.atomic():
        SideEffect.objects.create(key=THING)
        transaction.on_commit(partial(pt.read_side_effect.enqueue, key=THING))
        assert _runs_of(path) == []  # nothing enqueued before the commit
    [run_id] = _runs_of(path)
    return pt.read_side_effect.get_result(run_id)


def _enqueue_in_transaction() -> TaskResult:
    """The same without on_commit: DurableBackend writes the run in the transaction."""
    with transaction.atomic():
        SideEffect.objects.create(key=OTHER_THING)
        return pt.read_side_effect.enqueue(key=OTHER_THING)


def _build(b: Batch) -> None:
    b.enqueue("double_dictionary", lambda: pt.double_dictionary.enqueue((1, 2, 3)))
    b.enqueue("echo", lambda: pt.echo.enqueue((1, 2), {3: "three"}, key={"a": (3,)}))
    b.enqueue("on_commit", _enqueue_on_commit)
    b.enqueue("in_transaction", _enqueue_in_transaction)
    b.enqueue("meaning", pt.calculate_meaning_of_life.enqueue)
    b.enqueue("failed", pt.failing_task_value_error.enqueue)
    b.enqueue("divide_by_zero", pt.divide_by_zero.enqueue)
    b.enqueue("missing_datetime_key", pt.missing_datetime_key.enqueue)
    b.enqueue("running", lambda: pt.wait_for_release.enqueue(RELEASE))


def _while_running(b: Batch) -> None:
    """Catch the `running` case RUNNING, then let it finish."""
    result = b.result("running")
    wait_for_status(result, RUNNING)
    b.snapshots["running"] = result
    SideEffect.objects.create(key=f"{RELEASE}:release")


batch = batch_fixture(_build, "--concurrency", "4", during=_while_running)


# -- docs/topics/tasks.txt -----------------------------------------------------------------------


@pytest.mark.process
def test_arguments_round_trip_through_json(batch: Batch) -> None:
    """Docs, "Enqueueing Tasks": arguments go through a json.dumps/json.loads round trip. The task
    gets lists for tuples, and (as JSON has only string keys) string keys."""
    assert batch.result("echo").return_value == {
        "args": [[1, 2], {"3": "three"}],
        "kwargs": {"key": {"a": [3]}},
    }


@pytest.mark.process
def test_a_tuple_argument_arrives_as_a_list(batch: Batch) -> None:
    """Docs, "Enqueueing Tasks": `double_dictionary((1, 2, 3))` fails with
    `TypeError: unhashable type: 'list'`."""
    result = batch.result("double_dictionary")
    assert result.status == FAILED
    assert "TypeError: unhashable type: 'list'" in result.errors[0].traceback


def test_arguments_must_be_json_serializable() -> None:
    """Docs, "Enqueueing Tasks": a datetime argument raises TypeError at enqueue."""
    with pytest.raises(TypeError, match=re.escape("Unsupported type")):
        pt.noop_task.enqueue(datetime.now())


@pytest.mark.process
def test_enqueue_on_commit_with_partial(batch: Batch) -> None:
    """Docs, "Transactions": a task enqueued with `on_commit(partial(task.enqueue, ...))` finds the
    rows its transaction wrote."""
    result = batch.result("on_commit")
    assert result.status == SUCCESSFUL
    assert result.return_value == THING


@pytest.mark.process
def test_enqueue_inside_a_transaction_is_safe_too(batch: Batch) -> None:
    """Docs, "Transactions", and DurableBackend's own promise: the run is written in the caller's
    transaction, so no worker can run it before the rows it needs are committed."""
    result = batch.result("in_transaction")
    assert result.status == SUCCESSFUL
    assert result.return_value == OTHER_THING


@pytest.mark.process
def test_results_by_id_from_task_and_backend(batch: Batch) -> None:
    """Docs, "Task results": `task.get_result(id)` and `default_task_backend.get_result(id)`;
    "Return values": `return_value` of a successful task; `worker_ids`."""
    rid = batch.cases["meaning"].enqueued.id
    by_task = pt.calculate_meaning_of_life.get_result(rid)
    by_backend = default_task_backend.get_result(rid)
    assert by_task == by_backend
    assert (by_task.status, by_task.return_value) == (SUCCESSFUL, 42)
    assert len(by_task.worker_ids) == 1 and by_task.worker_ids[0]


@pytest.mark.process
def test_a_running_result_updates_on_refresh(batch: Batch) -> None:
    """Docs, "Updating results" and "Return values": a RUNNING result has no return value yet
    (ValueError "Task has not finished yet") and stays as read until `refresh()`."""
    result = batch.snapshots["running"]
    assert result.status == RUNNING
    assert result.started_at is not None and result.finished_at is None
    with pytest.raises(ValueError, match=re.escape("Task has not finished yet")):
        _ = result.return_value
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.return_value == RELEASE


@pytest.mark.process
def test_errors_hold_exception_class_and_traceback(batch: Batch) -> None:
    """Docs, "Errors": `errors[0].exception_class` and the traceback as a string."""
    [error] = batch.result("failed").errors
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):")


@pytest.mark.process
def test_signals_from_the_enqueuing_process_and_the_worker(batch: Batch) -> None:
    """docs/ref/signals.txt: task_enqueued, task_started and task_finished, sent with the
    backend's class and the task result; started and finished from the worker's process."""
    assert batch.cases["meaning"].enqueued_signals == 1
    started, finished = batch.worker_records("meaning")
    assert started["pid"] == finished["pid"] != os.getpid()
    for record in (started, finished):
        assert record["sender"] == "tasks_engine.backends.DurableBackend"
    assert (started["kind"], started["status"]) == ("started", "RUNNING")
    assert (finished["kind"], finished["status"]) == ("finished", "SUCCESSFUL")


def test_task_enqueued_waits_for_the_commit(django_capture_on_commit_callbacks: Any) -> None:
    """docs/ref/signals.txt task_enqueued, DurableBackend's promise: sent once the run is
    committed, never for an enqueue that rolls back."""
    sent: list[str] = []

    def on_enqueued(sender: type, task_result: TaskResult, **kwargs: object) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(on_enqueued)
    try:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            result = pt.noop_task.enqueue()
            assert sent == []
        assert len(callbacks) == 1
    finally:
        task_enqueued.disconnect(on_enqueued)
    assert sent == [result.id]


def test_result_ids_are_short_strings() -> None:
    """docs/ref/tasks.txt TaskResult.id: a string, under 64 characters."""
    result = pt.noop_task.enqueue()
    assert isinstance(result.id, str) and len(result.id) < 64


# -- tests/tasks/test_tasks.py: TaskError ----------------------------------------------------


@pytest.mark.process
def test_task_error_invalid_exception(batch: Batch) -> None:
    """TaskTestCase.test_task_error_invalid_exception (a failed task from the worker)."""
    result = batch.result("failed")
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "subprocess.run")
    with pytest.raises(
        ValueError, match=re.escape("'subprocess.run' does not reference a valid exception.")
    ):
        _ = result.errors[0].exception_class


@pytest.mark.process
def test_task_error_unknown_module(batch: Batch) -> None:
    """TaskTestCase.test_task_error_unknown_module."""
    result = batch.result("failed")
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", "does.not.exist")
    with pytest.raises(ImportError):
        _ = result.errors[0].exception_class


# -- tests/tasks/test_utils.py: tracebacks ----------------------------------------------------


@pytest.mark.process
def test_exception_traceback(batch: Batch) -> None:
    """ExceptionTracebackTestCase.test_exception."""
    [error] = batch.result("divide_by_zero").errors
    assert "ZeroDivisionError: division by zero" in error.traceback


@pytest.mark.process
def test_complex_exception_traceback(batch: Batch) -> None:
    """ExceptionTracebackTestCase.test_complex_exception."""
    [error] = batch.result("missing_datetime_key").errors
    assert "KeyError: datetime.datetime" in error.traceback
