"""What a workflow sees: TaskContext and its abort signal. The step API (`ctx.step`) is in
step_api.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import TaskCanceledError
from ..values.secrets import mask_secrets
from .fencing import run_fenced
from .step_api import StepAPI

if TYPE_CHECKING:
    from .step_base import RunState


class AbortSignal:
    """Set when the run must stop: canceled, lease lost, deadline passed or worker stopping."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()  # the run's thread and the heartbeat both set it
        self.reason: BaseException | None = None
        self._listener: Callable[[], None] | None = None

    @property
    def aborted(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def abort(self, reason: BaseException) -> bool:
        """Set the signal (the first reason wins); whether this call set it."""
        with self._lock:
            if self._event.is_set():
                return False
            self.reason = reason
            self._event.set()
            listener = self._listener
        if listener is not None:
            listener()  # an async run's: cancel the task in user code (runtime/async_steps.py)
        return True

    def on_abort(self, listener: Callable[[], None] | None) -> None:
        """Call `listener` (from the aborting thread) whenever the signal is set."""
        with self._lock:
            self._listener = listener

    def reset(self, reason: BaseException) -> None:
        """Clear the signal if `reason` set it: a step timeout ends with its step."""
        with self._lock:
            if self.reason is reason:
                self._event.clear()
                self.reason = None


class TaskContext:
    def __init__(
        self,
        *,
        input: Any,
        run_id: uuid.UUID,
        task_name: str,
        version: int,
        queue: str,
        trace_id: str,
        priority: int,
        attempt: int,
        state: RunState,
        logger: Callable[[], Any],
    ) -> None:
        self._input = input
        self._run_id = run_id
        self._task_name = task_name
        self._version = version
        self._queue = queue
        self._trace_id = trace_id
        self._priority = priority
        self._attempt = attempt
        self._attempt_token = state.lease.token
        self._abort_signal = AbortSignal()
        self._make_logger = logger
        self._logger: Any = None
        self._state = state
        self._step = self._make_steps()

    # What a workflow reads of its run: read-only, so that code which assigns to one (a typo
    # for a local, say) fails at once instead of changing what the engine reads back.

    @property
    def input(self) -> Any:
        return self._input

    @property
    def run_id(self) -> uuid.UUID:
        return self._run_id

    @property
    def task_name(self) -> str:
        return self._task_name

    @property
    def version(self) -> int:
        return self._version

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def trace_id(self) -> str:
        return self._trace_id

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def attempt_token(self) -> uuid.UUID:
        return self._attempt_token

    @property
    def abort_signal(self) -> AbortSignal:
        return self._abort_signal

    @property
    def step(self) -> StepAPI:
        return self._step

    def _make_steps(self) -> StepAPI:
        return StepAPI(self)

    def _load_input(self, value: Any) -> None:
        """The executor's: the run's stored input, validated by the workflow's model."""
        self._input = value

    @property
    def logger(self) -> Any:
        """structlog, bound to run id, task, version and trace id (made on first use)."""
        if self._logger is None:
            self._logger = self._make_logger()
        return self._logger

    def raise_if_canceled(self) -> None:
        """Raise the abort reason (TaskCanceledError, LeaseLostError, ...) once aborted."""
        reason = self.abort_signal.reason
        if reason is not None:
            raise reason
        if self._state.handle.cancel_requested:
            raise TaskCanceledError(f"run {self.run_id} was canceled")

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record progress; the worker persists it at most about once a second, off this thread.
        The message is stored with secrets redacted, as errors are: the admin shows it."""
        shown = mask_secrets(message)
        self._state.handle.report_progress({"done": done, "total": total, "message": shown})

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the code path of change `change_id` (see
        docs/evolving-workflows.md): True when it reaches this call with new code (a marker
        is recorded) or replays a history holding the marker; False when its history passed
        this point before the change existed. The same answer on every replay."""
        return self.step.patched(change_id)

    def with_attempt_token(
        self, op_key: str, fn: Callable[[Any], Any], *, commit: Callable[[Any], Any] | None = None
    ) -> Any:
        self.raise_if_canceled()
        return run_fenced(self._state.lease, self._state.current_step, op_key, fn, commit=commit)
