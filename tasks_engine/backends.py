"""Django's tasks framework on the durable engine: `DurableBackend` and the `django_task` workflow.

`TASKS = {"default": {"BACKEND": "tasks_engine.backends.DurableBackend"}}` turns every
`@django.tasks.task` into a durable single-step run: `enqueue` writes the run on the caller's
connection (it commits or rolls back with the caller's transaction), `runworker` imports the task
by its module path and calls it inside one `ctx.step.run`, and `get_result` reads the run back.

A task runs once unless it asks for more: `@task(max_attempts=3)` (Django 6.1 passes extra
`@task` options to the backend's `task_class`, here `DurableTask`; Django 6.0's `@task` does
not, and there `task(f).using(max_attempts=3)` sets them). An exception fails the
attempt; the last failed attempt fails the run. `idempotency_key` (a string formatted with the
call's arguments, or a callable taking them) dedupes enqueues: the same key returns the
existing result, the same key with other arguments raises `IdempotencyConflict`.

Where it differs from Django's own backends, on purpose (README, "Django's tasks framework"):
- Values JSON cannot hold exactly (NaN, ±Infinity, a NUL character) are refused: arguments at
  `enqueue` (`UnstorableValueError`, a TypeError and ValueError, before anything is written),
  a return value by failing the task. Django's backends keep them in memory, but PostgreSQL's
  jsonb cannot store them, and storing something else would change the value silently.
- `SystemExit` and `KeyboardInterrupt` raised by a task fail it at once (no retry), with
  `task_finished` and an ERROR log like any exception: in a worker they can only come from
  the task's own code (the worker handles SIGINT and SIGTERM itself).
- `task_started` and `task_finished` are sent robustly in the worker: a failing receiver is
  logged by Django and does not change the task's outcome.

Django 6.0 or later (`django.tasks` is new in 6.0): on 5.2 importing this module raises an
ImportError that says so, and the check tasks_engine.E030 reports a TASKS that names it.

Import-safe before apps load (Django builds backends while modules are being imported): the
engine and its models are imported inside functions.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.dispatch import Signal
from django.utils.module_loading import import_string
from pydantic import BaseModel

from . import clock
from .conf import no_django_tasks_message

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ModuleNotFoundError as missing:  # Django 5.2: the engine works, this backend cannot
    raise ImportError(no_django_tasks_message()) from missing
from .db.alias import on_commit
from .definitions import QUEUE_MAX_LENGTH, RetryPolicy, workflow
from .exceptions import EngineUnavailable, LeaseLostError, NonRetryableError, Suspend
from .values.durations import duration_seconds
from .values.serialization import encode_error, to_jsonable
from .values.text import check_text

if TYPE_CHECKING:
    from .models import WorkflowRun
    from .runtime.context import TaskContext as RunContext

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


class _Unset(enum.Enum):
    """The default of an option whose None means something: `using(idempotency_key=None)`
    removes the key, so None cannot also stand for "not given, keep it"."""

    UNSET = enum.auto()


_UNSET = _Unset.UNSET


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
        idempotency_key: IdempotencyKey | _Unset = _UNSET,
    ) -> DurableTask:
        """A copy with the options given changed. `idempotency_key=None` removes the task's
        key; without the argument the key is kept (the other options keep theirs on None, as
        in Django)."""
        task: Task = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        changes: dict[str, Any] = {}
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        if idempotency_key is not _UNSET:
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
        # QUEUES as in Django: absent means {"default"}, an empty list accepts any name. One
        # that is no list of names (a bare string would become a set of letters) counts as
        # absent here, and check() reports it.
        self.queues_setting = params.get("QUEUES")  # as configured, for check()
        if not _valid_queues_setting(self.queues_setting):
            params = {k: v for k, v in params.items() if k != "QUEUES"}
        super().__init__(alias, params)
        # The django_task workflow's RetryPolicy intervals, as configured: check() reports a
        # bad one (E013), and the policy refuses it when a task runs.
        self.retry_interval: Any = self.options.get("RETRY_INITIAL_INTERVAL", 1.0)
        self.retry_max_interval: Any = self.options.get("RETRY_MAX_INTERVAL", 60.0)

    def validate_task(self, task: Task) -> None:
        if (problem := _option_type_problem(task)) is not None:
            raise InvalidTask(problem)  # before Django's checks, which crash on these
        super().validate_task(task)
        if (problem := _queue_problem(task.queue_name)) is not None:
            raise InvalidTask(problem)
        attempts = getattr(task, "max_attempts", 1)
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise InvalidTask(f"max_attempts must be a whole number >= 1, got {attempts!r}")
        key = getattr(task, "idempotency_key", None)
        if key is not None and not isinstance(key, str) and not callable(key):
            raise InvalidTask(f"idempotency_key must be a string or a callable, got {key!r}")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        from . import engine

        self.validate_task(task)
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        # NaN, ±Infinity and NUL are refused here, before any SQL: the caller's transaction
        # goes on (a NUL reaching PostgreSQL would abort it), and no value is silently changed.
        stored = to_jsonable(
            {"args": args, "kwargs": kwargs}, what=f"the arguments of {task.module_path}"
        )
        data = DjangoTaskInput(
            task=task.module_path,
            args=stored["args"],
            kwargs=stored["kwargs"],
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
            priority=int(task.priority),  # Django accepts a whole float (5.0)
            available_at=task.run_after,
            queue=task.queue_name,
        )
        result = self.get_result(str(res.run_id))
        if not res.deduplicated:
            # Sent once the run is durable: never for an enqueue whose transaction rolls back.
            on_commit(lambda: task_enqueued.send(type(self), task_result=result), robust=True)
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

        errors = [*self._check_queues(), *self._check_retry()]
        if not apps.is_installed("tasks_engine"):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses DurableBackend but the engine app is not "
                    "installed",
                    hint="Add 'tasks_engine' to INSTALLED_APPS.",
                    id="tasks_engine.E010",
                )
            )
        return errors

    def _check_retry(self) -> list[checks.CheckMessage]:
        """The RETRY_* options are RetryPolicy intervals: RetryPolicy's rule (seconds or a
        timedelta, from 0 to 36,500 days), checked here with the option's name."""
        errors: list[checks.CheckMessage] = []
        for key, value in (
            ("RETRY_INITIAL_INTERVAL", self.retry_interval),
            ("RETRY_MAX_INTERVAL", self.retry_max_interval),
        ):
            try:
                duration_seconds(value, f"TASKS[{self.alias!r}]['OPTIONS'][{key!r}]", zero_ok=True)
            except (TypeError, ValueError) as exc:
                errors.append(checks.Error(str(exc), id="tasks_engine.E013"))
        return errors

    def _check_queues(self) -> list[checks.CheckMessage]:
        """QUEUES must name queues a run can be stored under. Which queues workers serve is
        not known here: workers pick theirs with `runworker --queue` (every queue without it)
        and are not recorded in the database, so only the setting itself can be checked."""
        raw = self.queues_setting
        where = f"TASKS[{self.alias!r}]['QUEUES']"
        if not _valid_queues_setting(raw):
            return [
                checks.Error(
                    f"{where} must be a list of queue names, not {type(raw).__name__} {raw!r}",
                    hint="For example QUEUES: ['default', 'emails'] (an empty list accepts "
                    "any queue name).",
                    id="tasks_engine.E011",
                )
            ]
        bad = sorted(repr(q) for q in self.queues if _queue_problem(q) is not None)
        if bad:
            return [
                checks.Error(
                    f"{where} holds names no run can be stored under: {', '.join(bad)}",
                    hint=f"Queue names are non-empty strings of at most {QUEUE_MAX_LENGTH} "
                    "characters, without a NUL character.",
                    id="tasks_engine.E012",
                )
            ]
        return []

    # -- reading a run back -------------------------------------------------------------------

    def _result(self, run: WorkflowRun) -> TaskResult:
        """The run as Django sees it. The task is rebuilt from its module path, so that
        `Task.get_result()`, which compares task functions, accepts it."""
        from .models import StepAttempt
        from .runtime.history import is_give_up

        data = DjangoTaskInput.model_validate(run.input)
        alias = self._alias(data.backend)
        rows = list(
            StepAttempt.objects.filter(run_id=run.pk, name=CALL_STEP)
            .order_by("id")
            .values_list("worker_id", "started_at", "error")
        )
        # The attempts of the call that ran: not the give-up row a worker records without
        # calling the task when every allowed attempt died with its worker (its error, the
        # reason the task failed, stays in `errors`).
        calls = [(w, at) for w, at, e in rows if not is_give_up(e)]
        errors = [_task_error(e) for _, _, e in rows if e]
        last = rows[-1][2] if rows else None
        if run.status == "failed" and run.error and not _same_error(last, run.error):
            # Failed outside a recorded call error: before the call (no DurableBackend under
            # that alias), by SystemExit or KeyboardInterrupt, or by a deadline.
            errors.append(_task_error(run.error))
        result: TaskResult = TaskResult(
            task=_rebuild_task(data, run, alias),
            id=str(run.pk),
            status=STATUS_MAP[run.status],
            enqueued_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            last_attempted_at=calls[-1][1] if calls else None,
            args=data.args,
            kwargs=data.kwargs,
            backend=alias,
            errors=errors,
            worker_ids=[w for w, _ in calls],
        )
        if run.status == "completed":
            object.__setattr__(result, "_return_value", run.output)
        return result

    def _alias(self, enqueued_with: str) -> str:
        """The alias the run was enqueued through, while TASKS still has it (else this one's),
        so that `result.task.get_backend()` and `result.refresh()` use that backend."""
        from django.tasks import task_backends

        return enqueued_with if enqueued_with in task_backends.settings else self.alias


def _idempotency_key(task: Task, args: list[Any], kwargs: dict[str, Any]) -> str | None:
    """The call's key: the task's format string filled with the call's arguments, or what its
    callable returns for them (a string; an int stands for its digits). TypeError, naming the
    task, for a key the arguments do not fill or a callable's other value (None was the key
    "None", under which every call deduped into the first)."""
    key = getattr(task, "idempotency_key", None)
    if key is None:
        return None
    if callable(key):
        value = key(*args, **kwargs)
    else:
        try:
            value = key.format(*args, **kwargs)
        except (IndexError, KeyError, AttributeError, ValueError) as exc:
            raise TypeError(
                f"the idempotency_key {key!r} of {task.module_path} does not format with the"
                f" call's arguments (args {args!r}, kwargs {kwargs!r}): {exc!r}"
            ) from exc
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(
            f"the idempotency_key callable of {task.module_path} returned {value!r}, not a string"
        )
    return str(value)


def _option_type_problem(task: Task) -> str | None:
    """Why `priority` or `run_after` is of a type Django's checks would crash on (ValueError
    for NaN, TypeError for a string, AttributeError for a date) or let through to fail at
    enqueue (a bool, a run_after past year 9999 in UTC), or None."""
    from .engine import utc_range_problem

    priority = task.priority
    number = isinstance(priority, int | float) and not isinstance(priority, bool)
    if not number or not math.isfinite(priority):
        return (
            f"priority must be a whole number between {TASK_MIN_PRIORITY} and"
            f" {TASK_MAX_PRIORITY}, not {priority!r}"
        )
    run_after = task.run_after
    if run_after is None:
        return None
    if not isinstance(run_after, datetime):
        return f"run_after must be an aware datetime, not {type(run_after).__name__}"
    return None if run_after.utcoffset() is None else utc_range_problem("run_after", run_after)


def _queue_problem(queue: Any) -> str | None:
    """Why no run can be stored under `queue` (the rule @workflow and enqueue apply), or None."""
    try:
        check_text("queue_name", queue, QUEUE_MAX_LENGTH)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def _valid_queues_setting(value: Any) -> bool:
    """None (absent) or an iterable of names that is not itself a string."""
    if value is None:
        return True
    if isinstance(value, str | bytes):
        return False
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _same_error(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and (a.get("type"), a.get("message")) == (b.get("type"), b.get("message"))


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


def _rebuild_task(data: DjangoTaskInput, run: WorkflowRun, alias: str) -> Task:
    """The task as it was enqueued: its alias, priority, queue, run_after and max_attempts.
    Built without `validate_task`, so a stored run still reads back after TASKS changed (a
    queue dropped from QUEUES, an alias removed): the task was validated when enqueued."""
    try:
        task = load_task(data.task)
    except UnknownDjangoTask:
        task = _unvalidated(DurableTask, {"func": _missing_task})
    values = {f.name: getattr(task, f.name) for f in fields(task)}
    enqueued = {
        "priority": run.priority,
        "queue_name": run.queue,
        "run_after": data.run_after,
        "backend": alias,
        "max_attempts": data.max_attempts,
    }
    values.update((k, v) for k, v in enqueued.items() if k in values)
    return _unvalidated(type(task), values)


def _unvalidated(cls: type[Task], values: dict[str, Any]) -> Task:
    """A frozen task with these field values, skipping `__post_init__` (its validation)."""
    task = object.__new__(cls)
    for f in fields(cls):
        object.__setattr__(task, f.name, values.get(f.name, f.default))
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
        _send(task_started, backend, result)
        if data.takes_context:
            value = task.call(TaskContext(task_result=result), *data.args, **data.kwargs)
        else:
            value = task.call(*data.args, **data.kwargs)
        # TypeError for a type JSON has none for (as Django's backends), UnstorableValueError
        # for NaN, ±Infinity or NUL: the attempt fails here, before anything says it succeeded.
        return to_jsonable(normalize_json(value), what=f"the return value of {data.task}")

    try:
        value = ctx.step.run(CALL_STEP, call, retry=policy)
    except (LeaseLostError, Suspend, EngineUnavailable):
        raise  # another worker owns the run now, a retry is scheduled, or the database is away
    except BaseException as exc:
        # The last attempt failed (earlier ones suspend the run instead of raising here). Sent
        # inside this handler, so Django's receiver logs the exception (ERROR, with exc_info).
        if not isinstance(ctx.abort_signal.reason, LeaseLostError):
            result = _current(backend, ctx, TaskResultStatus.FAILED)
            if not isinstance(exc, Exception):
                # SystemExit, KeyboardInterrupt: not a step failure, the run records it.
                result.errors.append(_task_error(encode_error(exc)))
            _send(task_finished, backend, result)
        raise
    _send(task_finished, backend, _current(backend, ctx, TaskResultStatus.SUCCESSFUL, value))
    return value


def _send(signal: Signal, backend: DurableBackend, result: TaskResult) -> None:
    """Receivers' errors are logged by Django ("django.dispatch") and change nothing: the
    task has run (or failed) whatever a receiver does."""
    signal.send_robust(type(backend), task_result=result)


def _current(
    backend: DurableBackend, ctx: RunContext, status: TaskResultStatus, value: Any = None
) -> TaskResult:
    """The run's result as the worker sees it mid-pass (the row says `running` until the end)."""
    result = backend.get_result(str(ctx.run_id))
    object.__setattr__(result, "status", status)
    if status != TaskResultStatus.RUNNING:
        object.__setattr__(result, "finished_at", clock.now())  # the engine's, as the run's
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
    return result
