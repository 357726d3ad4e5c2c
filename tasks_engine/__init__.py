"""UMT durable tasks: durable workflows for Django on PostgreSQL (and SQLite).

Import-safe before apps load: the engine API is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it); CHANGELOG.md

from .definitions import RetryPolicy, Workflow, workflow
from .exceptions import (
    AsyncStepError,
    AtomicStepTimeoutError,
    DeadlineExceededError,
    FactTimeoutError,
    FencingError,
    IdempotencyConflict,
    LeaseLostError,
    NonDeterminismError,
    NonRetryableError,
    StepFailedError,
    StepTimeoutError,
    TaskCanceledError,
    TransactionPoolerError,
    UnknownRunError,
    UnknownStepError,
    UnknownTaskError,
    UnstorableValueError,
)

__all__ = [
    "AsyncStepError",
    "AsyncTaskContext",
    "AtomicStepTimeoutError",
    "DeadlineExceededError",
    "Enqueued",
    "FactTimeoutError",
    "FencingError",
    "IdempotencyConflict",
    "LeaseLostError",
    "NonDeterminismError",
    "NonRetryableError",
    "OpInfo",
    "RetryPolicy",
    "RunView",
    "Signaled",
    "StepFailedError",
    "StepTimeoutError",
    "TaskCanceledError",
    "TaskContext",
    "TransactionPoolerError",
    "UnknownRunError",
    "UnknownStepError",
    "UnknownTaskError",
    "UnstorableValueError",
    "Workflow",
    "acancel",
    "aenqueue",
    "aenqueue_many",
    "aget_run",
    "alist_runs",
    "aretry_run",
    "asignal",
    "await_run",
    "cancel",
    "cancel_runs",
    "enqueue",
    "enqueue_many",
    "get_run",
    "list_queues",
    "list_runs",
    "pause_queue",
    "resume_queue",
    "retry_run",
    "retry_runs",
    "set_queue_limits",
    "signal",
    "wait",
    "workflow",
]

_ENGINE = {
    "enqueue",
    "enqueue_many",
    "signal",
    "cancel",
    "retry_run",
    "get_run",
    "list_runs",
    "wait",
    "Enqueued",
    "Signaled",
    "RunView",
}
_BULK = {"cancel_runs", "retry_runs"}
_QUEUES = {"pause_queue", "resume_queue", "set_queue_limits", "list_queues"}
_ASYNC = {
    "aenqueue",
    "aenqueue_many",
    "asignal",
    "acancel",
    "aget_run",
    "alist_runs",
    "aretry_run",
    "await_run",
}

if TYPE_CHECKING:
    from .engine import (
        Enqueued,
        RunView,
        Signaled,
        cancel,
        enqueue,
        enqueue_many,
        get_run,
        list_runs,
        retry_run,
        signal,
        wait,
    )
    from .operations.async_api import (
        acancel,
        aenqueue,
        aenqueue_many,
        aget_run,
        alist_runs,
        aretry_run,
        asignal,
        await_run,
    )
    from .operations.bulk import cancel_runs, retry_runs
    from .operations.queues import list_queues, pause_queue, resume_queue, set_queue_limits
    from .runtime.async_steps import AsyncTaskContext
    from .runtime.context import TaskContext
    from .runtime.fencing import OpInfo


if not TYPE_CHECKING:  # type checkers see the names above, not a catch-all for any name

    def __getattr__(name: str) -> Any:
        if name in _ENGINE:
            from . import engine

            return getattr(engine, name)
        if name in _QUEUES:
            from .operations import queues

            return getattr(queues, name)
        if name in _ASYNC:
            from .operations import async_api

            return getattr(async_api, name)
        if name == "AsyncTaskContext":
            from .runtime.async_steps import AsyncTaskContext

            return AsyncTaskContext
        if name in _BULK:
            from .operations import bulk

            return getattr(bulk, name)
        if name == "TaskContext":
            from .runtime.context import TaskContext

            return TaskContext
        if name == "OpInfo":  # what `ctx.step.op` passes to its function
            from .runtime.fencing import OpInfo

            return OpInfo
        raise AttributeError(f"module 'tasks_engine' has no attribute {name!r}")
