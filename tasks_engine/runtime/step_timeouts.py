"""Step timeouts: the timer a timed step attempt shares with the worker's heartbeat.

No thread per step: the heartbeat fires every due timer (it sleeps no longer than until the
earliest one, and a step that arms a timer wakes it to recompute). Firing sets
`ctx.abort_signal` with a `StepTimeoutError`; the step then fails with it and is retried
under its retry policy. A step that ignores the abort is written off by the heartbeat after
the grace: the attempt is recorded failed, the run requeued (the lease token changes, so the
stuck thread can never write again), and the next pass retries the step or, when its
retries are spent, raises the StepTimeoutError into the workflow.

Exactly one side records the attempt's outcome: `stop()` (the step's own thread) and
`take_write_off()` (the heartbeat) decide under one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..exceptions import LeaseLostError, StepTimeoutError
from ..values.durations import duration_seconds


def timeout_seconds(
    timeout: timedelta | float | None, what: str = "timeout", *, limit: float | None = None
) -> float | None:
    """Seconds from a timedelta or a number; None stays None. Refuses 0, negative, NaN, inf
    and a bool (and more than `limit` seconds, when given): durations.duration_seconds."""
    if timeout is None:
        return None
    return duration_seconds(timeout, what, limit=limit)


@dataclass
class WriteOff:
    """What the heartbeat records when the step ignores its abort: the attempt's error, and
    the retry backoff (None: the step's retries are spent; the error is terminal)."""

    step_id: int
    error: dict[str, Any]
    retry_in: float | None


@dataclass
class StepTimer:
    key: str
    seconds: float
    write_off: WriteOff
    deadline: float = field(default=0.0)  # monotonic
    fired: StepTimeoutError | None = None
    _done: bool = False
    _written_off: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def fire(self, now: float, abort: Callable[[StepTimeoutError], Any]) -> bool:
        """Heartbeat: if the timer is due, `abort` the run with the timeout (once). Under the
        lock, so that the step's `stop()` sees either no timeout or one whose abort is set."""
        with self._lock:
            if self._done or self.fired is not None or now < self.deadline:
                return False
            self.fired = self._timed_out()
            abort(self.fired)
            return True

    def stop(self) -> StepTimeoutError | None:
        """The step's thread, once its body returned or raised: disarm, and say whether the
        step timed out. Raises LeaseLostError if the heartbeat already wrote it off.

        A body that outlived its timeout timed out even if the heartbeat has not fired the
        timer yet: the heartbeat can be late (on SQLite it waits for the write lock, which an
        atomic step's own transaction holds until this very step commits), and the attempt
        must fail, its transaction rolled back, whoever noticed the time first."""
        with self._lock:
            self._done = True
            if self._written_off:
                raise LeaseLostError(f"step {self.key!r} was written off after its timeout")
            if self.fired is None and time.monotonic() >= self.deadline:
                self.fired = self._timed_out()
            return self.fired

    def _timed_out(self) -> StepTimeoutError:
        return StepTimeoutError(f"step {self.key!r} timed out after {self.seconds:g} seconds")

    def take_write_off(self) -> bool:
        """Heartbeat, past the grace: whether it records the outcome (the step has not)."""
        with self._lock:
            if self._done or self.fired is None:
                return False
            self._written_off = True
            return True
