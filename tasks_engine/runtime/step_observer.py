"""Around each executed step attempt: its metrics and its span, in one `with` block.

Every kind of step a workflow calls is observed: function steps (step_api.py), sleeps, fact waits
and child runs (waits.py); `patched` markers run nothing and are not. A step is observed once
per attempt that ends in an execution, never when replay already knows its outcome:

- a function step: each attempt of its body, `completed`, `failed` (retried or not), or
  `aborted` (cancel, deadline, lost lease, worker stopping);
- a wait: once, by the claim that resolves it (`completed`, or `failed`: a fact timeout, the
  child's failure or timeout), from its armed attempt to its outcome in that claim, not the
  time the run spent parked. A claim that parks it, hands the run back, loses its lease or
  meets an outage observes nothing (a later claim goes on with the same attempt); one that
  ends it for the run's cancel or deadline observes it `aborted`.

The span is made once the attempt has ended, with the time it began as its start (so a claim
that parks a wait makes none). When neither metrics nor tracing is on, `observed_step` returns
a shared object whose enter and exit do nothing: a step pays one function call and one
attribute read for both.
"""

from __future__ import annotations

import time
from typing import Any

from ..exceptions import LeaseLostError, Suspend, TaskCanceledError
from ..observe import metrics, tracing
from ..states import StepKind
from ..values.secrets import redact_text


class _Unobserved:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


UNOBSERVED = _Unobserved()


class _Observed:
    __slots__ = ("ctx", "key", "kind", "span", "started", "started_ns", "token")

    def __init__(self, ctx: Any, key: str, kind: str) -> None:
        self.ctx, self.key, self.kind = ctx, key, kind
        self.span: Any = None
        self.token: Any = None

    def __enter__(self) -> None:
        self.started_ns = 0
        if self.ctx._state.span is not None:
            if self.kind == StepKind.FUNCTION:
                # The body's own spans (an HTTP client's, say) nest under its step.
                self.span = tracing.start_step_span(self.ctx, self.key, self.kind)
                self.token = tracing.make_current(self.span)
            else:
                self.started_ns = time.time_ns()
        self.started = time.monotonic()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        seconds = time.monotonic() - self.started
        if self.token is not None:
            tracing.stop_current(self.token)
        if self.kind == StepKind.FUNCTION:
            status = _status(self.ctx, exc)
        elif (wait_status := _wait_status(self.ctx, exc)) is not None:
            status = wait_status
        else:
            return  # the wait goes on in a later claim, which observes it
        metrics.record_step(self.ctx.task_name, self.kind, status, seconds)
        span = self.span
        if self.started_ns:
            span = tracing.start_step_span(self.ctx, self.key, self.kind, self.started_ns)
        if span is not None:
            cause = exc.__cause__ if isinstance(exc, Suspend) else exc
            tracing.end_step_span(span, status, _failure_message(status, cause))


def _failure_message(status: str, exc: BaseException | None) -> str | None:
    """A failed attempt's message for its span: redacted as its stored error and the logs are,
    before the span cuts it (a password cut in two would no longer look like one)."""
    if status != "failed" or exc is None:
        return None
    return redact_text(str(exc))


def _status(ctx: Any, exc: BaseException | None) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, Suspend):  # a retry is scheduled: this attempt failed
        return "failed" if isinstance(exc.__cause__, Exception) else "suspended"
    if ctx.abort_signal.aborted:
        return "aborted"  # canceled, lease lost, deadline, worker stopping
    return "failed" if isinstance(exc, Exception) else "aborted"


def _wait_status(ctx: Any, exc: BaseException | None) -> str | None:
    """A wait's outcome in this claim; None when its attempt stays armed for a later claim:
    parked or handed back (Suspend), an outage (EngineUnavailable), a lost lease."""
    if exc is None:
        return "completed"
    reason = ctx.abort_signal.reason
    if (
        not isinstance(exc, Exception)
        or isinstance(exc, LeaseLostError)
        or isinstance(reason, LeaseLostError)
    ):
        return None
    if reason is not None or (
        isinstance(exc, TaskCanceledError) and ctx._state.handle.cancel_requested
    ):
        return "aborted"  # this run's cancel or deadline (a canceled child fails the wait)
    return "failed"


WAITS = (StepKind.SLEEP, StepKind.FACT_WAIT, StepKind.CHILD)


def observe_waits_ended_by_deadline(ctx: Any) -> None:
    """The claim that fails a run for its deadline does so before replay: the waits it had
    armed (a sleep, a fact wait, a child) end with it, observed `aborted` here as replay would
    have observed them (its span an instant: what this claim did for the wait)."""
    if ctx._state.span is None and not metrics.enabled():
        return
    for key, rec in ctx._state.history.records.items():
        if rec.kind not in WAITS or rec.armed is None:
            continue
        metrics.record_step(ctx.task_name, rec.kind, "aborted", 0.0)
        span = tracing.start_step_span(ctx, key, rec.kind)
        if span is not None:
            tracing.end_step_span(span, "aborted", None)


def observed_step(ctx: Any, key: str, kind: str) -> _Observed | _Unobserved:
    if ctx._state.span is None and not metrics.enabled():
        return UNOBSERVED
    return _Observed(ctx, key, kind)
