"""Every error the engine raises, and the suspension signals that unwind a handler."""

from __future__ import annotations

from django.db import ProgrammingError


class TasksEngineError(Exception):
    """Base class of the engine's errors."""


class UnknownTaskError(TasksEngineError, LookupError):
    """No workflow is registered under that name (and version)."""


class UnknownRunError(TasksEngineError, LookupError):
    """No run has that id."""


class IdempotencyConflict(TasksEngineError):
    """The idempotency key is taken by a run with a different input."""


class NonRetryableError(TasksEngineError):
    """Raise (or subclass) to fail a step or workflow at once, without retries."""


class TaskCanceledError(TasksEngineError):
    """Cancel was requested for the run."""


class LeaseLostError(TasksEngineError):
    """This attempt no longer holds the run's lease; it may not write anything."""


class WorkerStopping(LeaseLostError):
    """The worker is stopping and gives the run up: it is handed back for another worker at
    once, and the interrupted attempt does not count against its retries."""


class DeadlineExceededError(NonRetryableError):
    """The run's deadline passed."""


class FencingError(LeaseLostError):
    """A fenced write was refused because the attempt lost its lease."""


class StepFailedError(TasksEngineError):
    """A step failed for good and its original exception class cannot be rebuilt."""


class FactTimeoutError(TasksEngineError):
    """`wait_for_fact` timed out before a fact arrived."""


class StepTimeoutError(TasksEngineError):
    """A step ran past its `timeout` (its attempt fails and is retried under the step's retry
    policy), or a child run did not finish within `run_child`'s timeout (the child is
    canceled). Also `ctx.abort_signal.reason` while a timed-out step still runs."""


class NonDeterminismError(NonRetryableError):
    """Replay met a recorded step of a different kind under the same name."""


class MaxStepAttemptsExceeded(NonRetryableError):
    """The run made more step attempts than MAX_STEP_ATTEMPTS_PER_RUN allows."""


class UnstorableValueError(NonRetryableError, TypeError, ValueError):
    """A value cannot be stored as JSON: a datetime, a set, NaN, ±Infinity, a NUL character.
    A step that returns one fails at once, without retrying (its side effects ran once)."""


class AsyncStepError(NonRetryableError, TypeError):
    """A step function of a plain workflow is an `async def` (or returns an awaitable): no
    one would await it. Its step fails at once, without retrying."""


class EngineUnavailable(BaseException):
    """An engine write could not reach the database. The worker drops the run (its lease
    expires and any worker replays it); user code cannot catch it as a workflow error."""


class TransactionPoolerError(TasksEngineError, ProgrammingError):
    """A prepared statement was lost to a transaction pooler (PgBouncer in transaction mode)
    that the settings do not declare: a configuration error, not an outage. Its message names
    the settings to change (tasks_engine/db/pooler.py)."""


class Suspend(BaseException):
    """Unwinds the handler when the run parks. BaseException: `except Exception` can't eat it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class AtomicStepTimeoutError(NonRetryableError):
    """An atomic step held SQLite's write lock past SQLITE_ATOMIC_STEP_SECONDS: rolled back."""


class UnknownStepError(TasksEngineError, ValueError):
    """`retry_run(from_step=...)` names no step the run recorded."""


class UnknownScheduleError(TasksEngineError, LookupError):
    """No schedule of that name is defined (in code or TASKS_ENGINE["SCHEDULES"])."""
