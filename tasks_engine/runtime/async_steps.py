"""The step API of an `async def` workflow: `await ctx.step.run(...)` and the rest.

Each step is the plain step's code (step_api.py, waits.py, patches.py), split where user code
runs: the engine's parts (replay, the fenced start, the outcome's write) go to the run's
`Bridge` (bridge.py), off the event loop; a step function that is an `async def`, or returns
an awaitable, is awaited on the loop in a task of its own; a plain one runs in a thread.

An abort (cancel, step timeout, deadline, lost lease, worker stopping) sets `ctx.abort_signal`
as for a plain run, and cancels the task running user code at that moment: the step's body, or
the workflow's own body between steps (never an engine part: it ends, and the next step's
guard raises the abort). The body sees `asyncio.CancelledError` at its next `await`; the step
then ends as the plain step would have ended with that abort.

The steps of one run run one at a time, in the order the workflow awaits them, so that their
names (`name#n`) and replay stay deterministic: a step call that is never awaited, or several
in flight at once (`asyncio.gather` over step calls), is a TypeError that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Callable, Coroutine, Generator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..exceptions import AsyncStepError, LeaseLostError, Suspend
from ..states import StepKind
from .bridge import Bridge, awaited, resolve_from_thread
from .context import TaskContext
from .fencing import Done, OpInfo, begin_fenced, commit_fenced
from .step_api import Replayed, StepAPI, _stored
from .step_observer import observed_step

if TYPE_CHECKING:
    from ..definitions import RetryPolicy, Workflow
    from .step_timeouts import StepTimer


class StepCall:
    """What a step call of an async workflow returns: awaiting it runs the step. Used as a
    truth value (`if ctx.patched("x"):`) it is a TypeError, never a silent True."""

    __slots__ = ("_coro", "_steps", "what")

    def __init__(self, steps: AsyncStepAPI, what: str, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._steps = steps
        self.what = what

    def __await__(self) -> Generator[Any, None, Any]:
        self._steps._awaited(self)
        return self._coro.__await__()

    def __bool__(self) -> bool:
        self.close()
        raise TypeError(
            f"{self.what} is awaitable in an async workflow: write `await {self.what}`"
            f" (as in `if await {self.what}:`)"
        )

    def close(self) -> None:
        self._steps._awaited(self)
        self._coro.close()


class _Cancel:
    """The task that runs the run's user code now, canceled on an abort (from any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.target: asyncio.Task[Any] | None = None

    def from_any_thread(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run has ended
            self.loop.call_soon_threadsafe(self.now)

    def now(self) -> None:
        if self.target is not None and not self.target.done():
            self.target.cancel()


class AsyncStepAPI:
    """`ctx.step` of an async workflow: run, sleep, wait_for_fact, run_child and patched,
    each awaited."""

    def __init__(self, ctx: AsyncTaskContext) -> None:
        self._ctx = ctx
        self._sync = StepAPI(ctx)
        self._bridge: Bridge | None = None
        self._cancel: _Cancel | None = None
        self._pending: list[StepCall] = []  # made, not awaited yet
        self._busy = ""  # the step in flight

    # -- the run (executor.aexecute) ------------------------------------------------------------

    def bind(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._cancel = _Cancel(bridge.loop)
        self._ctx.abort_signal.on_abort(self._cancel.from_any_thread)

    async def body(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """The workflow's own body, as the task an abort cancels between steps."""
        return await self._cancellable(coro)

    def check_all_awaited(self) -> None:
        """The workflow returned: a step call it made and never awaited is its error."""
        if self._pending:
            call = self._pending[0]
            for left in list(self._pending):
                left.close()
            raise TypeError(
                f"{call.what} was never awaited, so the step never ran: write `await {call.what}`"
            )

    # -- the steps ------------------------------------------------------------------------------

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retry: RetryPolicy | None = None,
        atomic: bool = False,
        timeout: timedelta | float | None = None,
    ) -> StepCall:
        return self._call(
            f"ctx.step.run({name!r}, ...)", self._run(name, fn, retry, atomic, timeout)
        )

    def sleep(self, name: str, duration: timedelta | float) -> StepCall:
        return self._call(
            f"ctx.step.sleep({name!r}, ...)", self._step(name, self._sync.sleep, name, duration)
        )

    def wait_for_fact(
        self,
        name: str,
        *,
        timeout: timedelta | float | None = None,
        check: Callable[[], Any] | None = None,
        check_interval: timedelta | float = 30,
    ) -> StepCall:
        if check is not None:
            check = functools.partial(_check_from_thread, check)
        wait = functools.partial(
            self._sync.wait_for_fact,
            name,
            timeout=timeout,
            check=check,
            check_interval=check_interval,
        )
        return self._call(f"ctx.step.wait_for_fact({name!r})", self._step(name, wait))

    def run_child(
        self,
        workflow_or_name: Workflow | str,
        input: Any = None,
        *,
        name: str,
        queue: str | None = None,
        timeout: timedelta | float | None = None,
    ) -> StepCall:
        child = functools.partial(
            self._sync.run_child, workflow_or_name, input, name=name, queue=queue, timeout=timeout
        )
        return self._call(f"ctx.step.run_child(..., name={name!r})", self._step(name, child))

    def patched(self, change_id: str) -> StepCall:
        return self._call(
            f"ctx.patched({change_id!r})",
            self._step(change_id, self._sync.patched, change_id),
        )

    # -- how ------------------------------------------------------------------------------------

    def _call(self, what: str, coro: Coroutine[Any, Any, Any]) -> StepCall:
        if self._pending:
            earlier = self._pending[0]
            coro.close()
            for left in list(self._pending):
                left.close()  # never run: no "never awaited" warning either
            raise TypeError(
                f"{what} was called while {earlier.what} was not awaited yet: the steps of a"
                f" run run one at a time; write `await {earlier.what}` first (asyncio.gather"
                " over step calls is not supported: gather inside one step's function instead)"
            )
        call = StepCall(self, what, coro)
        self._pending.append(call)
        return call

    def _awaited(self, call: StepCall) -> None:
        if call in self._pending:
            self._pending.remove(call)

    def _enter(self, name: str) -> None:
        if self._busy:
            raise TypeError(
                f"step {name!r} began while step {self._busy!r} was still running: the steps of"
                " a run run one at a time; await each before the next"
            )
        self._busy = name

    async def _step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A step that runs no user code on the loop: all of it off the loop."""
        self._enter(str(name))
        try:
            return await self.engine(fn, *args)
        finally:
            self._busy = ""

    async def engine(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Engine work off the loop. No abort cancels the caller meanwhile: the work goes on
        in its thread whatever the loop does, and the step's next guard sees the abort."""
        bridge, cancel = self._bridge, self._cancel
        if bridge is None or cancel is None:
            raise RuntimeError("this async workflow's context is not running")
        saved, cancel.target = cancel.target, None
        try:
            return await bridge.engine(fn, *args, **kwargs)
        finally:
            cancel.target = saved

    async def blocking(self, fn: Callable[[], Any]) -> Any:
        assert self._bridge is not None
        return await self._bridge.blocking(fn)

    async def _run(
        self,
        name: str,
        fn: Callable[[], Any],
        retry: RetryPolicy | None,
        atomic: bool,
        timeout: timedelta | float | None,
    ) -> Any:
        if atomic and inspect.iscoroutinefunction(fn):
            fn_name = getattr(fn, "__name__", "fn")
            raise AsyncStepError(
                f"step {name!r}: atomic=True needs a plain function (its database writes must"
                " run in the step's transaction, on the thread that holds it), and"
                f" {fn_name} is an async def: define it with def (it runs in a thread)"
            )
        self._enter(str(name))
        try:
            if atomic:
                sync = self._sync
                return await self.engine(
                    sync.run, name, fn, retry=retry, atomic=True, timeout=timeout
                )
            return await self._run_body(name, fn, retry, timeout)
        finally:
            self._busy = ""

    async def _run_body(
        self,
        name: str,
        fn: Callable[[], Any],
        retry: RetryPolicy | None,
        timeout: timedelta | float | None,
    ) -> Any:
        sync = self._sync
        if self._opens_in_memory(name):  # no statement: no trip off the loop
            opened = sync._open(name, retry, timeout, in_memory=True)
        else:
            opened = await self.engine(sync._open, name, retry, timeout)
        if isinstance(opened, Replayed):
            return opened.value
        try:
            with observed_step(self._ctx, opened.key, StepKind.FUNCTION):
                output = await self._timed(opened.key, fn, opened.timer)
        except (Suspend, LeaseLostError):
            raise
        except Exception as exc:
            await self.engine(sync._failed, opened, exc)
            raise
        return sync._close(opened, output)

    def _opens_in_memory(self, name: str) -> bool:
        """Whether opening step `name` makes no statement, so that the loop may open it
        itself: a fresh run's first step, which its claim started already (the claim guessed
        its name: first_steps.py), while the worker is not draining (a drain hands the run
        back, a write). Everything else `_open` does then is in memory: the history is empty,
        the cancel and abort checks read flags, a timer is made, not written."""
        s = self._ctx._state
        guess = s.prestarted
        return (
            s.fresh
            and not s.started
            and guess is not None
            and guess[0] == name
            and not s.history.name_counts
            and not s.draining.is_set()
        )

    async def _timed(self, key: str, fn: Callable[[], Any], timer: StepTimer | None) -> Any:
        """The body, cancellable by an abort; with a timer, a step that ran past it fails
        with StepTimeoutError (step_api.StepAPI._call_timed)."""
        if timer is not None:
            self._ctx._state.handle.arm_timer(timer)
        try:
            value = await self._cancellable(self._invoke(fn))
        except BaseException as exc:
            if timer is not None:
                self._sync._stop_timer(timer)  # raises its StepTimeoutError if it fired
            reason = self._ctx.abort_signal.reason
            if isinstance(exc, asyncio.CancelledError) and reason is not None:
                raise reason from None  # the abort's outcome, as a plain step's
            raise
        if timer is not None:
            self._sync._stop_timer(timer)
        return _stored(key, fn, value)

    async def _invoke(self, fn: Callable[[], Any]) -> Any:
        if inspect.iscoroutinefunction(fn):
            value = fn()
        else:
            value = await self.blocking(fn)  # a lambda's coroutine is made there, awaited here
        return await awaited(value)

    async def _cancellable(self, coro: Coroutine[Any, Any, Any]) -> Any:
        cancel = self._cancel
        assert cancel is not None
        task = cancel.loop.create_task(coro)
        saved, cancel.target = cancel.target, task
        if self._ctx.abort_signal.aborted:
            task.cancel()
        try:
            return await task
        finally:
            cancel.target = saved


def _check_from_thread(check: Callable[[], Any]) -> Any:
    """A fact wait's `check`, called on the engine's thread: an async one is awaited there."""
    return resolve_from_thread(check())


class AsyncTaskContext(TaskContext):
    """The context of an `async def` workflow: `ctx.step.*`, `ctx.patched` and
    `ctx.with_attempt_token` are awaited (a plain step function, which runs in a thread, calls
    `ctx.with_attempt_token` without `await`)."""

    step: AsyncStepAPI  # type: ignore[assignment]

    def _make_steps(self) -> Any:
        return AsyncStepAPI(self)

    def patched(self, change_id: str) -> StepCall:  # type: ignore[override]
        return self.step.patched(change_id)

    def with_attempt_token(
        self, op_key: str, fn: Callable[[Any], Any], *, commit: Callable[[Any], Any] | None = None
    ) -> Any:
        if not self._on_loop():  # a plain step function's thread
            return super().with_attempt_token(op_key, fn, commit=commit)
        return StepCall(
            self.step, f"ctx.with_attempt_token({op_key!r}, ...)", self._fenced(op_key, fn, commit)
        )

    def _on_loop(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return self.step._bridge is not None and running is self.step._bridge.loop

    async def _fenced(
        self, op_key: str, fn: Callable[[Any], Any], commit: Callable[[Any], Any] | None
    ) -> Any:
        if commit is not None and inspect.iscoroutinefunction(commit):
            raise TypeError(
                f"with_attempt_token({op_key!r}): commit runs in the fence's transaction, on the"
                " engine's thread: define it with def (it makes your business writes)"
            )
        self.raise_if_canceled()
        lease, step_name = self._state.lease, self._state.current_step
        steps = self.step
        started = await steps.engine(begin_fenced, lease, step_name, op_key)
        if isinstance(started, Done):
            return started.result
        info = OpInfo(op_key, started, lease.token)
        if inspect.iscoroutinefunction(fn):
            value = fn(info)
        else:
            value = await steps.blocking(functools.partial(fn, info))
        return await steps.engine(commit_fenced, lease, op_key, await awaited(value), commit)
