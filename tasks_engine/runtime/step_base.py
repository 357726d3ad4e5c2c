"""What every kind of step shares: the pass it runs in, and the replay prelude `_begin`.

`StepBase` is the one base of the step API's parts (function steps in step_api.py, waits in
waits.py, markers in patches.py): each step begins with `_begin(name, kind)`, which names the
call, checks it against the history and says whether replay already knows its outcome;
`_guard` and `_start` are the only way a step records a new attempt.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from .. import clock, transitions
from ..exceptions import MaxStepAttemptsExceeded, NonDeterminismError, Suspend, TaskCanceledError
from ..states import StepKind
from ..transitions import first_steps
from ..values.serialization import rebuild_error
from .attempt_handle import AttemptHandle
from .history import (
    FACT_NAME_LONGEST,
    SLEEP_KEY_LONGEST,
    STEP_KEY_LONGEST,
    Attempt,
    ReplayHistory,
    StepRecord,
)

if TYPE_CHECKING:
    from ..definitions import RetryPolicy
    from .context import TaskContext


@dataclass
class RunState:
    """One execution pass of a claimed run, on the run's own thread: what its steps and the
    executor share. What the worker's threads touch is in `handle`, behind its lock."""

    handle: AttemptHandle
    history: ReplayHistory
    step_retry: RetryPolicy  # the workflow's default for steps without their own
    deadline_at: datetime | None
    max_attempts_per_run: int
    draining: threading.Event
    fatal: BaseException | None = None  # ends the run failed, whatever user code catches
    current_step: str = ""  # the step whose function runs now (the op ledger's step column)
    span: Any = None  # this claim's OpenTelemetry span (observe/tracing.py), None when not tracing
    fresh: bool = False  # the run's first claim, no history: its first step teaches first_steps
    started: bool = False  # a step began in this pass (or the run ended without one)
    prestarted: tuple[str, int] | None = None  # (name, step id) its claim started, unused yet

    @property
    def lease(self) -> transitions.Lease:
        return self.handle.lease

    def progress_to_carry(self) -> dict[str, Any] | None:
        """The progress reported and not yet written: the write that lets the run go (a park,
        a hand-back) carries it, since the heartbeat's flush needs the lease it gives up."""
        return self.handle.take_dirty_progress()

    def progress_not_carried(self, progress: dict[str, Any] | None) -> None:
        """The write did not let the run go (the awaited thing came, or a cancel): the
        progress waits for the next write or flush again."""
        if progress is not None:
            self.handle.report_progress(progress)

    def first_step_begins(self, task: str, version: int, key: str | None) -> int | None:
        """A fresh run's first step begins (`key`; None: anything but a plain function step,
        or the run ends without any step); later calls do nothing. Returns the attempt its
        claim started if the claim guessed `key` (first_steps.py); a wrong guess is deleted
        and this workflow not guessed again by this process; an unguessed start teaches
        first_steps."""
        if not self.fresh or self.started:
            return None
        self.started = True
        if self.prestarted is None:
            first_steps.learn(task, version, key)
            return None
        (guessed, step_id), self.prestarted = self.prestarted, None
        if guessed == key:
            return step_id
        first_steps.forget(task, version)
        transitions.drop_prestarted_step(self.lease, step_id)
        return None

    @property
    def run_pass(self) -> int:
        return self.history.run_pass


@dataclass(frozen=True)
class Begun:
    key: str  # the call's name in the history (`name#n` for its n-th call)
    record: StepRecord | None
    replayed: bool  # the history holds its outcome: `value` (a terminal error was raised)
    value: Any = None


class StepBase:
    def __init__(self, ctx: TaskContext) -> None:
        self._ctx = ctx
        self._s = ctx._state

    def _begin(self, name: str, kind: str) -> Begun:
        """The prelude of every step: its key, its record (of the same kind, or the run fails
        with NonDeterminismError) and its replayed outcome, if any."""
        if kind == StepKind.FACT_WAIT and isinstance(name, str) and len(name) > FACT_NAME_LONGEST:
            raise ValueError(  # no signal could deliver it (a fact's name column)
                f"fact name {name[:40]!r}... is {len(name)} characters long:"
                f" at most {FACT_NAME_LONGEST}"
            )
        key = self._key(name, SLEEP_KEY_LONGEST if kind == StepKind.SLEEP else STEP_KEY_LONGEST)
        rec = self._record(key, kind)
        replayed, value = self._replayed(rec)
        return Begun(key, rec, replayed, value)

    def _key(self, name: str, longest: int = STEP_KEY_LONGEST) -> str:
        return self._s.history.next_key(name, longest)

    def _record(self, key: str, kind: str) -> StepRecord | None:
        try:
            return self._s.history.record(key, kind)
        except NonDeterminismError as err:
            self._s.fatal = err
            raise

    def _replayed(self, rec: StepRecord | None) -> tuple[bool, Any]:
        if rec is None:
            return False, None
        if (done := rec.completed) is not None:
            return True, done.output
        if (terminal := rec.terminal_error(self._s.run_pass)) is not None:
            raise rebuild_error(terminal)
        return False, None

    def _guard(self, *, drain: bool = True) -> None:
        """Before any new work: stop on abort or cancel, hand back when the worker drains.
        `drain=False`: the caller looked at the drain just before (an async run's step opened
        on its event loop, which must not write: `AsyncStepAPI._opens_in_memory`); a drain
        that began since is seen by the run's next step, as one that began a moment later."""
        self._ctx.raise_if_canceled()
        s = self._s
        if drain and s.draining.is_set():
            transitions.requeue_run(s.lease, clock.now(), progress=s.progress_to_carry())
            raise Suspend("handed back: worker stopping")
        if s.history.attempts_made >= s.max_attempts_per_run:
            err = MaxStepAttemptsExceeded(
                f"run made {s.history.attempts_made} step attempts (limit {s.max_attempts_per_run})"
            )
            s.fatal = err
            raise err
        s.history.attempts_made += 1

    def _start(self, key: str, kind: str, attempt_no: int, **fields: Any) -> int:
        """Record a step attempt; refused once cancel is requested (the run then ends). A
        fresh run's first step may have been started by its claim (first_steps.py)."""
        plain = kind == StepKind.FUNCTION and attempt_no == 1 and not fields
        ctx = self._ctx
        step_id = self._s.first_step_begins(ctx.task_name, ctx.version, key if plain else None)
        if step_id is not None:
            return step_id
        try:
            return transitions.start_step(
                self._s.lease, key, kind, attempt_no, self._s.run_pass, **fields
            )
        except TaskCanceledError:
            self._canceled()

    def _remember(self, key: str, kind: str, attempt: Attempt) -> None:
        self._s.history.remember(key, kind, attempt)

    def _canceled(self) -> NoReturn:
        """Cancel was requested (found under the run's row lock): nothing new starts, and the
        run ends canceled even if user code catches the error."""
        exc = TaskCanceledError(f"run {self._ctx.run_id} was canceled")
        self._s.handle.request_cancel()
        self._ctx.abort_signal.abort(exc)
        raise exc
