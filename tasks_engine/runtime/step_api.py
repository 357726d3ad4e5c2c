"""The step API (`ctx.step`): function steps here; waits in waits.py, markers in patches.py,
and the replay prelude they share in step_base.py."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .. import clock, transitions
from ..db import alias as engine_db
from ..db import sqlite_bounds
from ..definitions import RetryPolicy
from ..exceptions import (
    AsyncStepError,
    LeaseLostError,
    StepFailedError,
    StepTimeoutError,
    Suspend,
    TaskCanceledError,
    UnstorableValueError,
)
from ..states import StepKind, StepStatus
from ..values.serialization import encode_error, to_jsonable
from . import atomic_keepalive
from .history import GAVE_UP, Attempt
from .patches import PatchSteps
from .step_observer import observed_step
from .step_timeouts import StepTimer, WriteOff, timeout_seconds
from .waits import WaitSteps


class StepAPI(WaitSteps, PatchSteps):
    """`ctx.step`: run, sleep, wait_for_fact, run_child and patched, each replayed from the
    run's history (step_base.py) before it records anything new."""

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retry: RetryPolicy | None = None,
        atomic: bool = False,
        timeout: timedelta | float | None = None,
    ) -> Any:
        opened = self._open(name, retry, timeout)
        if isinstance(opened, Replayed):
            return opened.value
        key, timer = opened.key, opened.timer
        try:
            if atomic:
                with (
                    transitions.outage_guard(key, transitions.TRANSIENT_ERRORS),
                    sqlite_bounds.atomic_step(engine_db.atomic(), key),
                    atomic_keepalive.kept_alive(lambda: self._ctx.abort_signal.aborted),
                ):
                    output = self._call(key, fn, timer)
                    transitions.finish_step(
                        self._s.lease, opened.step_id, StepStatus.COMPLETED, output=output
                    )
            else:
                output = self._call(key, fn, timer)
        except (Suspend, LeaseLostError):
            raise
        except Exception as exc:
            self._failed(opened, exc)
            raise
        return self._close(opened, output, deferred=not atomic)

    def _open(
        self,
        name: str,
        retry: RetryPolicy | None,
        timeout: timedelta | float | None,
        *,
        in_memory: bool = False,
    ) -> Opened | Replayed:
        """A function step up to its body: replayed (its stored value), or its attempt
        started (the async step API runs this off the event loop, then awaits the body; or on
        the loop, `in_memory`, when it makes no statement: see `_guard`)."""
        seconds = timeout_seconds(timeout)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, not {retry!r}")
        begun = self._begin(name, StepKind.FUNCTION)
        if begun.replayed:
            return Replayed(begun.value)
        key, rec = begun.key, begun.record
        run_pass = self._s.run_pass
        policy = retry or self._s.step_retry
        failures = rec.counted_failures(run_pass) if rec else 0
        self._guard(drain=not in_memory)
        attempt_no = rec.next_attempt if rec else 1
        if failures >= policy.max_attempts:
            # Every earlier attempt died with its worker: fail for good instead of looping.
            exc = StepFailedError(
                f"step {key!r} was interrupted {failures} times without finishing"
            )
            # A give-up row: why the step failed, not an attempt that ran (history.GAVE_UP).
            error = {**encode_error(exc), "terminal": True, GAVE_UP: True}
            self._start(key, StepKind.FUNCTION, attempt_no, status="failed", error=error)
            self._remember(key, StepKind.FUNCTION, _att(0, "failed", run_pass, error=error))
            raise exc
        step_id = self._start(key, StepKind.FUNCTION, attempt_no)
        self._s.current_step = key
        timer = self._timer(key, step_id, seconds, policy, failures + 1) if seconds else None
        return Opened(key, step_id, policy, failures, timer)

    def _failed(self, opened: Opened, exc: Exception) -> None:
        """The body raised `exc`: an abort's goes on to the executor as is; a failure is
        recorded (terminal: returns, the caller re-raises it) or retried (raises Suspend)."""
        timer = opened.timer
        timed_out = timer is not None and exc is timer.fired
        if not timed_out and (self._ctx.abort_signal.aborted or isinstance(exc, TaskCanceledError)):
            return  # the executor closes the attempt as the abort reason says
        self._step_failed(opened.key, opened.step_id, exc, opened.policy, opened.failures + 1)

    def _close(self, opened: Opened, output: Any, *, deferred: bool = True) -> Any:
        """The body returned `output` (stored already when not `deferred`: an atomic step)."""
        if deferred:
            transitions.defer_step_completion(self._s.lease, opened.step_id, output)
        self._remember(
            opened.key,
            StepKind.FUNCTION,
            _att(opened.step_id, "completed", self._s.run_pass, output),
        )
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
            return self._call_timed(key, fn, timer)

    def _call_timed(self, key: str, fn: Callable[[], Any], timer: StepTimer | None) -> Any:
        if timer is None:
            return _stored(key, fn, fn())
        self._s.handle.arm_timer(timer)
        try:
            value = fn()
        except BaseException:
            self._stop_timer(timer)
            raise
        self._stop_timer(timer)
        return _stored(key, fn, value)

    def _stop_timer(self, timer: StepTimer) -> None:
        self._s.handle.disarm_timer()
        fired = timer.stop()  # LeaseLostError if the heartbeat wrote the attempt off
        if fired is None:
            return
        signal = self._ctx.abort_signal
        if signal.reason is fired:
            signal.reset(fired)  # the next step (or this one's retry) must not see it
        elif signal.aborted:
            return  # another abort came first (a cancel, a lost lease): it decides the attempt
        raise fired  # fired by the heartbeat, or found past its deadline by stop()

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
            progress=self._s.progress_to_carry(),
        )
        raise Suspend(f"step {key} retry in {delay}s") from exc


@dataclass(frozen=True)
class Replayed:
    value: Any  # the step's stored result


@dataclass(frozen=True)
class Opened:
    """A function step whose attempt is started: what its end needs."""

    key: str
    step_id: int
    policy: RetryPolicy
    failures: int  # counted failures before this attempt
    timer: StepTimer | None


def _stored(key: str, fn: Callable[[], Any], value: Any) -> Any:
    """The step's result as stored. An awaitable (from an async def, or a lambda that returns
    a coroutine) fails the step saying what to write instead; a coroutine's body has not run,
    and it is closed so that it never warns that it was not awaited. Looked for only once the
    value is refused: nothing on the way of a storable result."""
    try:
        return to_jsonable(value, f"the result of step {key!r}")
    except UnstorableValueError:
        if not inspect.isawaitable(value):
            raise
    if inspect.iscoroutine(value):
        value.close()
    what = "is an async def" if inspect.iscoroutinefunction(fn) else "returned an awaitable"
    raise AsyncStepError(
        f"step {key!r}: its function {what}, which a plain workflow would never await: make"
        " the workflow an async def and write `await ctx.step.run(...)`, or define the step"
        " function with def (an atomic=True step's function too: its writes must run in the"
        " step's transaction, on its thread)"
    ) from None


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
