"""UMT durable tasks: durable workflows for Django on PostgreSQL (and SQLite).

Import-safe before apps load: the engine API is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    "AtomicStepTimeoutError",
    "DeadlineExceededError",
    "Enqueued",
    "FactTimeoutError",
    "FencingError",
    "IdempotencyConflict",
    "LeaseLostError",
    "NonDeterminismError",
    "NonRetryableError",
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
    "cancel",
    "enqueue",
    "get_run",
    "list_queues",
    "list_runs",
    "pause_queue",
    "resume_queue",
    "retry_run",
    "set_queue_limits",
    "signal",
    "wait",
    "workflow",
]

_ENGINE = {
    "enqueue",
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
_QUEUES = {"pause_queue", "resume_queue", "set_queue_limits", "list_queues"}

if TYPE_CHECKING:
    from .context import TaskContext
    from .engine import (
        Enqueued,
        RunView,
        Signaled,
        cancel,
        enqueue,
        get_run,
        list_runs,
        retry_run,
        signal,
        wait,
    )
    from .queues import list_queues, pause_queue, resume_queue, set_queue_limits


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        from . import engine

        return getattr(engine, name)
    if name in _QUEUES:
        from . import queues

        return getattr(queues, name)
    if name == "TaskContext":
        from .context import TaskContext

        return TaskContext
    raise AttributeError(f"module 'tasks_engine' has no attribute {name!r}")
