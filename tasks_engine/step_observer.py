"""Around each executed step attempt: its metrics and its span, in one `with` block.

When neither metrics nor tracing is on, `observed_step` returns a shared object whose enter
and exit do nothing: a step pays one function call and one attribute read for both.
"""

from __future__ import annotations

import time
from typing import Any

from . import metrics, tracing
from .exceptions import Suspend


class _Unobserved:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


UNOBSERVED = _Unobserved()


class _Observed:
    __slots__ = ("ctx", "key", "kind", "span", "started")

    def __init__(self, ctx: Any, key: str, kind: str) -> None:
        self.ctx, self.key, self.kind = ctx, key, kind

    def __enter__(self) -> None:
        self.span = tracing.start_step_span(self.ctx, self.key, self.kind)
        self.started = time.monotonic()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        status = _status(self.ctx, exc)
        metrics.record_step(self.ctx.task_name, self.kind, status, time.monotonic() - self.started)
        if self.span is not None:
            cause = exc.__cause__ if isinstance(exc, Suspend) else exc
            tracing.end_step_span(self.span, status, cause)


def _status(ctx: Any, exc: BaseException | None) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, Suspend):  # a retry is scheduled: this attempt failed
        return "failed" if isinstance(exc.__cause__, Exception) else "suspended"
    if ctx.abort_signal.aborted:
        return "aborted"  # canceled, lease lost, deadline, worker stopping
    return "failed" if isinstance(exc, Exception) else "aborted"


def observed_step(ctx: Any, key: str, kind: str) -> _Observed | _Unobserved:
    if ctx._state.span is None and not metrics.enabled():
        return UNOBSERVED
    return _Observed(ctx, key, kind)
