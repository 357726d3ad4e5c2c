"""Django's tasks framework on the durable engine: `DurableBackend` and the `django_task` workflow.

`TASKS = {"default": {"BACKEND": "tasks_engine.backends.DurableBackend"}}` turns every
`@django.tasks.task` into a durable single-step run: `enqueue` writes the run on the caller's
connection (it commits or rolls back with the caller's transaction), `runworker` imports the task
by its module path and calls it inside one `ctx.step.run`, and `get_result` reads the run back.

A task runs once unless it asks for more: `@task(max_attempts=3)` (Django 6.1 passes extra
`@task` options to the backend's `task_class`, here `DurableTask`). An exception fails the
attempt; the last failed attempt fails the run. `idempotency_key` (a string formatted with the
call's arguments, or a callable taking them) dedupes enqueues: the same key returns the
existing result, the same key with other arguments raises `IdempotencyConflict`.

Import-safe before apps load (Django builds backends while modules are being imported): the
engine and its models are imported inside functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import transaction
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from pydantic import BaseModel

from .definitions import RetryPolicy, workflow
from .exceptions import LeaseLostError, NonRetryableError

if TYPE_CHECKING:
    from .context import TaskContext as RunContext
    from .models import WorkflowRun

DJANGO_TASK = "django_task"  # the built-in workflow that runs Django tasks
CALL_STEP = "call"  # its one step

STATUS_MAP: dict[str, TaskResultStatus] = {
    "pending": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "canceled": TaskResultStatus.FAILED,
}

IdempotencyKey = str | Callable[..., str] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(Task):
    """A Django task with the durable backend's options (`@task(max_attempts=..., ...)`)."""

    max_attempts: int = 1  # attempts of the call; a crash mid-call counts as one
    idempotency_key: IdempotencyKey = None  # "report:{0}" / "user:{user_id}" or a callable

    def using(  # type: ignore[override]
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        idempotency_key: IdempotencyKey = None,
    ) -> DurableTask:
        task: Task = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        changes: dict[str, Any] = {}
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        if idempotency_key is not None:
            changes["idempotency_key"] = idempotency_key
        return replace(task, **changes) if changes else task  # type: ignore[return-value]


class DjangoTaskInput(BaseModel):
    task: str  # module path of the Task object
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    backend: str = "default"
    max_attempts: int = 1
    takes_context: bool = False
    run_after: datetime | None = None


class UnknownDjangoTask(NonRetryableError):
    """The run names a task path that does not import to a Django task."""


class DurableBackend(BaseTaskBackend):
    task_class = DurableTask
    supports_defer = True
    supports_async_task = True  # run in the worker through asgiref's async_to_sync
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues = set()  # any queue name: it becomes the run's engine queue
        self.retry_interval = float(self.options.get("RETRY_INITIAL_INTERVAL", 1.0))
        self.retry_max_interval = float(self.options.get("RETRY_MAX_INTERVAL", 60.0))

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        attempts = getattr(task, "max_attempts", 1)
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise InvalidTask(f"max_attempts must be a whole number >= 1, got {attempts!r}")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        from . import engine

        self.validate_task(task)
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        data = DjangoTaskInput(
            task=task.module_path,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            max_attempts=getattr(task, "max_attempts", 1),
            takes_context=task.takes_context,
            run_after=task.run_after,
        )
        key = _idempotency_key(task, args, kwargs)
        res = engine.enqueue(
            DJANGO_TASK,
            data,
            idempotency_key=f"{task.module_path}:{key}" if key is not None else None,
            priority=task.priority,
            available_at=task.run_after,
            queue=task.queue_name,
        )
        result = self.get_result(str(res.run_id))
        if not res.deduplicated:
            # Sent once the run is durable: never for an enqueue whose transaction rolls back.
            transaction.on_commit(
                lambda: task_enqueued.send(type(self), task_result=result), robust=True
            )
        return result

    def get_result(self, result_id: str) -> TaskResult:
        from .models import WorkflowRun

        try:
            run_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        run = WorkflowRun.objects.filter(pk=run_id, task_name=DJANGO_TASK).first()
        if run is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(run)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from django.apps import apps

        if apps.is_installed("tasks_engine"):
            return []
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] uses DurableBackend but the engine app is not installed",
                hint="Add 'tasks_engine' to INSTALLED_APPS.",
                id="tasks_engine.E010",
            )
        ]

    # -- reading a run back -------------------------------------------------------------------

    def _result(self, run: WorkflowRun) -> TaskResult:
        """The run as Django sees it. The task is rebuilt from its module path, so that
        `Task.get_result()`, which compares task functions, accepts it."""
        from .models import StepAttempt

        data = DjangoTaskInput.model_validate(run.input)
        calls = list(
            StepAttempt.objects.filter(run_id=run.pk, name=CALL_STEP)
            .order_by("id")
            .values_list("worker_id", "started_at", "error")
        )
        errors = [_task_error(e) for _, _, e in calls if e]
        if run.error and not errors:
            errors.append(_task_error(run.error))  # failed before the call (e.g. unknown path)
        result: TaskResult = TaskResult(
            task=_rebuild_task(data, run),
            id=str(run.pk),
            status=STATUS_MAP[run.status],
            enqueued_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            last_attempted_at=calls[-1][1] if calls else None,
            args=data.args,
            kwargs=data.kwargs,
            backend=self.alias,
            errors=errors,
            worker_ids=[w for w, _, _ in calls],
        )
        if run.status == "completed":
            object.__setattr__(result, "_return_value", run.output)
        return result


def _idempotency_key(task: Task, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    key = getattr(task, "idempotency_key", None)
    if key is None:
        return None
    return str(key(*args, **kwargs) if callable(key) else key.format(*args, **kwargs))


def _task_error(error: dict[str, Any]) -> TaskError:
    return TaskError(
        exception_class_path=str(error.get("type", "builtins.Exception")),
        traceback=str(error.get("traceback") or error.get("message", "")),
    )


def _missing_task(*args: Any, **kwargs: Any) -> None:
    """Stands in for a task whose module path no longer imports (its result stays readable)."""
    raise UnknownDjangoTask("the task's module path does not import")


def load_task(path: str) -> Task:
    try:
        obj = import_string(path)
    except Exception as exc:  # ImportError, or whatever the module raised at import
        raise UnknownDjangoTask(f"cannot import Django task {path!r}: {exc!r}") from exc
    if not isinstance(obj, Task):
        raise UnknownDjangoTask(f"{path!r} is a {type(obj).__name__}, not a Django task")
    return obj


def _rebuild_task(data: DjangoTaskInput, run: WorkflowRun) -> Task:
    try:
        task = load_task(data.task)
    except UnknownDjangoTask:
        task = DurableTask(func=_missing_task, backend=data.backend)
    task = task.using(priority=run.priority, queue_name=run.queue, run_after=data.run_after)
    if isinstance(task, DurableTask) and task.max_attempts != data.max_attempts:
        task = replace(task, max_attempts=data.max_attempts)  # as enqueued (`.using(...)`)
    return task


# -- the worker side ----------------------------------------------------------------------------


@workflow(name=DJANGO_TASK, version=1, input=DjangoTaskInput)
def django_task(ctx: RunContext) -> Any:
    """Run one Django task in one step; retries only when the task asked for them."""
    from django.tasks import task_backends

    data: DjangoTaskInput = ctx.input
    backend = task_backends[data.backend]
    if not isinstance(backend, DurableBackend):
        raise UnknownDjangoTask(f"TASKS[{data.backend!r}] is not a DurableBackend")
    policy = RetryPolicy(
        max_attempts=data.max_attempts,
        initial_interval=backend.retry_interval,
        max_interval=backend.retry_max_interval,
        non_retryable=(UnknownDjangoTask,),
    )

    def call() -> Any:
        task = load_task(data.task)
        result = _current(backend, ctx, TaskResultStatus.RUNNING)
        task_started.send(type(backend), task_result=result)
        if data.takes_context:
            value = task.call(TaskContext(task_result=result), *data.args, **data.kwargs)
        else:
            value = task.call(*data.args, **data.kwargs)
        return normalize_json(value)

    try:
        value = ctx.step.run(CALL_STEP, call, retry=policy)
    except LeaseLostError:
        raise  # another worker owns the run now (or this one is handing it back)
    except Exception:
        # The last attempt failed (earlier ones suspend the run instead of raising here).
        if not isinstance(ctx.abort_signal.reason, LeaseLostError):
            task_finished.send(
                type(backend), task_result=_current(backend, ctx, TaskResultStatus.FAILED)
            )
        raise
    task_finished.send(
        type(backend), task_result=_current(backend, ctx, TaskResultStatus.SUCCESSFUL, value)
    )
    return value


def _current(
    backend: DurableBackend, ctx: RunContext, status: TaskResultStatus, value: Any = None
) -> TaskResult:
    """The run's result as the worker sees it mid-pass (the row says `running` until the end)."""
    result = backend.get_result(str(ctx.run_id))
    object.__setattr__(result, "status", status)
    if status != TaskResultStatus.RUNNING:
        object.__setattr__(result, "finished_at", timezone.now())
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
    return result
