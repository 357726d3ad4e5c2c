"""What a workflow sees: TaskContext, its abort signal, and the step API that replays history."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction

from . import clock, sqlite_bounds, transitions
from .attempt_handle import AttemptHandle
from .exceptions import (
    LeaseLostError,
    MaxStepAttemptsExceeded,
    NonDeterminismError,
    StepFailedError,
    StepTimeoutError,
    Suspend,
    TaskCanceledError,
)
from .patches import PatchSteps
from .serialization import encode_error, to_jsonable
from .states import StepKind, StepStatus
from .step_observer import observed_step
from .step_timeouts import StepTimer, WriteOff, timeout_seconds
from .waits import WaitSteps

if TYPE_CHECKING:
    from .definitions import RetryPolicy, Workflow


class AbortSignal:
    """Set when the run must stop: canceled, lease lost, deadline passed or worker stopping."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()  # the run's thread and the heartbeat both set it
        self.reason: BaseException | None = None

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
            return True

    def reset(self, reason: BaseException) -> None:
        """Clear the signal if `reason` set it: a step timeout ends with its step."""
        with self._lock:
            if self.reason is reason:
                self._event.clear()
                self.reason = None


@dataclass
class Attempt:
    id: int
    status: str
    run_pass: int
    counted: bool
    output: Any
    error: dict[str, Any] | None
    wake_at: datetime | None


@dataclass
class StepRecord:
    name: str
    kind: str
    attempts: list[Attempt] = field(default_factory=list)
    superseded: int = 0  # attempts an operator's retry from an earlier step set aside

    @property
    def next_attempt(self) -> int:
        return self.superseded + len(self.attempts) + 1

    @property
    def completed(self) -> Attempt | None:
        return next((a for a in self.attempts if a.status == StepStatus.COMPLETED), None)

    @property
    def armed(self) -> Attempt | None:
        """A timer or wait that was started and not yet resolved."""
        return next((a for a in self.attempts if a.status == StepStatus.RUNNING), None)

    def counted_failures(self, run_pass: int) -> int:
        return sum(
            1
            for a in self.attempts
            if a.run_pass == run_pass
            and (a.status == StepStatus.FAILED or (a.status == StepStatus.ABANDONED and a.counted))
        )

    def terminal_error(self, run_pass: int) -> dict[str, Any] | None:
        for a in reversed(self.attempts):
            if a.run_pass == run_pass and a.status == StepStatus.FAILED and a.error:
                return a.error if a.error.get("terminal") else None
        return None


@dataclass
class RunState:
    """Mutable state of one execution pass, shared by the context and the executor."""

    lease: transitions.Lease
    handle: AttemptHandle  # what the worker's threads share with this one
    workflow: Workflow
    run_pass: int
    deadline_at: datetime | None
    history: dict[str, StepRecord]
    attempts_made: int
    max_attempts_per_run: int
    draining: threading.Event
    seen: set[str] = field(default_factory=set)
    name_counts: dict[str, int] = field(default_factory=dict)
    fatal: BaseException | None = None
    current_step: str = ""  # the step whose function runs now (the op ledger's step column)
    patches: dict[str, bool] = field(default_factory=dict)  # ctx.patched() answers this pass
    span: Any = None  # this claim's OpenTelemetry span (tracing.py), None when not tracing


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
        self.input = input
        self.run_id = run_id
        self.task_name = task_name
        self.version = version
        self.queue = queue
        self.trace_id = trace_id
        self.priority = priority
        self.attempt = attempt
        self.attempt_token = state.lease.token
        self.abort_signal = AbortSignal()
        self._make_logger = logger
        self._logger: Any = None
        self._state = state
        self.step = StepAPI(self)

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
        """Record progress; the worker persists it at most about once a second, off this thread."""
        self._state.handle.report_progress({"done": done, "total": total, "message": message})

    def patched(self, change_id: str) -> bool:
        """Whether this run takes the code path of change `change_id` (see
        docs/evolving-workflows.md): True when it reaches this call with new code (a marker
        is recorded) or replays a history holding the marker; False when its history passed
        this point before the change existed. The same answer on every replay."""
        return self.step.patched(change_id)

    def with_attempt_token(
        self, op_key: str, fn: Callable[[Any], Any], *, commit: Callable[[Any], Any] | None = None
    ) -> Any:
        from .fencing import with_attempt_token

        return with_attempt_token(self, op_key, fn, commit=commit)


class StepAPI(PatchSteps, WaitSteps):
    def __init__(self, ctx: TaskContext) -> None:
        self._ctx = ctx
        self._s = ctx._state

    # -- bookkeeping --------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        if not name or "#" in name:
            raise ValueError(f"invalid step name {name!r} (non-empty, no '#')")
        n = self._s.name_counts.get(name, 0) + 1
        self._s.name_counts[name] = n
        key = name if n == 1 else f"{name}#{n}"
        self._s.seen.add(key)
        return key

    def _record(self, key: str, kind: str) -> StepRecord | None:
        rec = self._s.history.get(key)
        if rec is not None and rec.attempts and rec.kind != kind:
            err = NonDeterminismError(
                f"step {key!r} was recorded as {rec.kind!r} but replay called it as {kind!r}"
            )
            self._s.fatal = err
            raise err
        return rec

    def _guard(self) -> None:
        """Before any new work: stop on abort or cancel, hand back when the worker drains."""
        self._ctx.raise_if_canceled()
        if self._s.draining.is_set():
            transitions.requeue_run(self._s.lease, clock.now())
            raise Suspend("handed back: worker stopping")
        if self._s.attempts_made >= self._s.max_attempts_per_run:
            err = MaxStepAttemptsExceeded(
                f"run made {self._s.attempts_made} step attempts (limit "
                f"{self._s.max_attempts_per_run})"
            )
            self._s.fatal = err
            raise err
        self._s.attempts_made += 1

    def _remember(self, key: str, kind: str, attempt: Attempt) -> None:
        rec = self._s.history.setdefault(key, StepRecord(key, kind))
        if not rec.attempts:
            rec.kind = kind  # only superseded attempts before: the step may be of a new kind
        rec.attempts.append(attempt)

    # -- steps --------------------------------------------------------------------------------

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retry: RetryPolicy | None = None,
        atomic: bool = False,
        timeout: timedelta | float | None = None,
    ) -> Any:
        seconds = timeout_seconds(timeout)
        key = self._key(name)
        rec = self._record(key, StepKind.FUNCTION)
        found, value = self._replayed(rec)
        if found:
            return value
        run_pass = self._s.run_pass
        policy = retry or self._s.workflow.step_retry
        failures = rec.counted_failures(run_pass) if rec else 0
        self._guard()
        lease = self._s.lease
        attempt_no = rec.next_attempt if rec else 1
        if failures >= policy.max_attempts:
            # Every earlier attempt died with its worker: fail for good instead of looping.
            exc = StepFailedError(
                f"step {key!r} was interrupted {failures} times without finishing"
            )
            error = {**encode_error(exc), "terminal": True}
            self._start(key, StepKind.FUNCTION, attempt_no, status="failed", error=error)
            self._remember(key, StepKind.FUNCTION, _att(0, "failed", run_pass, error=error))
            raise exc
        step_id = self._start(key, StepKind.FUNCTION, attempt_no)
        self._s.current_step = key
        timer = self._timer(key, step_id, seconds, policy, failures + 1) if seconds else None
        try:
            if atomic:
                with (
                    transitions.outage_guard(key, transitions.TRANSIENT_ERRORS),
                    sqlite_bounds.atomic_step(transaction.atomic(), key),
                ):
                    output = self._call(key, fn, timer)
                    transitions.finish_step(lease, step_id, StepStatus.COMPLETED, output=output)
            else:
                output = self._call(key, fn, timer)
        except (Suspend, LeaseLostError):
            raise
        except Exception as exc:
            timed_out = timer is not None and exc is timer.fired
            if not timed_out and (
                self._ctx.abort_signal.aborted or isinstance(exc, TaskCanceledError)
            ):
                raise  # the executor closes the attempt as the abort reason says
            self._step_failed(key, step_id, exc, policy, failures + 1)
            raise
        if not atomic:
            transitions.defer_step_completion(lease, step_id, output)
        self._remember(key, StepKind.FUNCTION, _att(step_id, "completed", run_pass, output))
        return output

    def _timer(
        self, key: str, step_id: int, seconds: float, policy: RetryPolicy, failures: int
    ) -> StepTimer:
        """The timer of a timed attempt, with what a write-off records (decided now, as
        `_step_failed` would decide for a StepTimeoutError)."""
        probe = StepTimeoutError(f"step {key!r} timed out after {seconds:g} seconds")
        error: dict[str, Any] = dict(encode_error(probe))
        terminal = _terminal(policy, probe, failures)
        if terminal:
            error["terminal"] = True
        retry_in = None if terminal else policy.delay(failures)
        return StepTimer(key, seconds, WriteOff(step_id, error, retry_in))

    def _call(self, key: str, fn: Callable[[], Any], timer: StepTimer | None) -> Any:
        """Run the step's body (observed: metrics, span); with a timer, the attempt fails with
        StepTimeoutError when the timer fired first (whatever the body did), and the abort it
        caused ends here."""
        with observed_step(self._ctx, key, StepKind.FUNCTION):
            return self._call_timed(fn, timer)

    def _call_timed(self, fn: Callable[[], Any], timer: StepTimer | None) -> Any:
        if timer is None:
            return to_jsonable(fn())
        self._s.handle.arm_timer(timer)
        try:
            value = fn()
        except BaseException:
            self._stop_timer(timer)
            raise
        self._stop_timer(timer)
        return to_jsonable(value)

    def _stop_timer(self, timer: StepTimer) -> None:
        self._s.handle.disarm_timer()
        fired = timer.stop()  # LeaseLostError if the heartbeat wrote the attempt off
        signal = self._ctx.abort_signal
        if fired is not None and signal.reason is fired:
            signal.reset(fired)  # the next step (or this one's retry) must not see it
            raise fired

    def _step_failed(
        self, key: str, step_id: int, exc: Exception, policy: RetryPolicy, failures: int
    ) -> None:
        error: dict[str, Any] = dict(encode_error(exc))
        run_pass = self._s.run_pass
        if _terminal(policy, exc, failures):
            error["terminal"] = True
            transitions.finish_step(self._s.lease, step_id, StepStatus.FAILED, error=error)
            self._remember(key, StepKind.FUNCTION, _att(step_id, "failed", run_pass, error=error))
            return  # the caller re-raises the original exception into the workflow
        delay = policy.delay(failures)
        self._ctx.logger.warning(
            "step failed, retrying", step=key, attempt=failures, retry_in=delay, error=str(exc)
        )
        transitions.requeue_run(
            self._s.lease,
            clock.now() + timedelta(seconds=delay),
            failed_step=(step_id, error),
        )
        raise Suspend(f"step {key} retry in {delay}s") from exc


def _terminal(policy: RetryPolicy, exc: BaseException, failures: int) -> bool:
    return not policy.is_retryable(exc) or failures >= policy.max_attempts


def _att(
    step_id: int,
    status: str,
    run_pass: int,
    output: Any = None,
    error: dict[str, Any] | None = None,
    wake_at: datetime | None = None,
) -> Attempt:
    return Attempt(step_id, status, run_pass, True, output, error, wake_at)
