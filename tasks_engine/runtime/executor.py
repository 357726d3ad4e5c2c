"""Run one claimed run: replay its history, call the handler, record the outcome."""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .. import clock, transitions
from ..conf import engine_settings
from ..definitions import Workflow, registry
from ..exceptions import (
    AsyncStepError,
    DeadlineExceededError,
    EngineUnavailable,
    LeaseLostError,
    Suspend,
    TaskCanceledError,
    UnknownTaskError,
    WorkerStopping,
)
from ..models import WorkflowRun
from ..observe import metrics, tracing
from ..observe.logs import run_logger
from ..states import current_pass
from ..values.serialization import encode_error, to_jsonable
from .async_steps import AsyncStepAPI, AsyncTaskContext
from .attempt_handle import AttemptHandle
from .bridge import Bridge, in_caller
from .context import TaskContext
from .history import ReplayHistory, load_history
from .step_base import RunState
from .step_observer import observe_waits_ended_by_deadline


@dataclass(frozen=True)
class Prepared:
    """A claimed run ready to execute: its workflow, the context its handler gets, and the
    handle the worker holds to renew, cancel, time out and flush it from other threads."""

    workflow: Workflow
    ctx: TaskContext
    handle: AttemptHandle


def build_context(
    run: WorkflowRun,
    lease: transitions.Lease,
    draining: threading.Event,
    prestarted: tuple[str, int] | None = None,
) -> tuple[Workflow, TaskContext]:
    """`prepare` for callers that drive a run on their own thread (tests, `testing`)."""
    prepared = prepare(run, lease, draining, prestarted)
    return prepared.workflow, prepared.ctx


def prepare(
    run: WorkflowRun,
    lease: transitions.Lease,
    draining: threading.Event,
    prestarted: tuple[str, int] | None = None,
) -> Prepared:
    """The run's workflow, context and handle. `prestarted`: the first step's attempt its
    claim started (`Claimed.prestarted`, first_steps.py), taken by the run's first step."""
    wf = registry.find(run.task_name, run.version)
    if wf is None:
        raise UnknownTaskError(f"unknown task {run.task_name}@{run.version}")
    if run.attempts > 1:
        transitions.close_interrupted_attempts(lease)
        history, count = load_history(run.pk)
    else:
        history, count = {}, 0
    handle = AttemptHandle(
        lease,
        has_parent=run.parent_run_id is not None,
        cancel_requested=run.cancel_requested_at is not None,
    )
    state = RunState(
        handle=handle,
        history=ReplayHistory(history, current_pass(run.failures, run.pass_offset), count),
        step_retry=wf.step_retry,
        deadline_at=run.deadline_at,
        max_attempts_per_run=engine_settings().max_step_attempts_per_run,
        draining=draining,
        fresh=run.attempts == 1 and run.failures == 0 and run.pass_offset == 0,
        prestarted=prestarted,
    )
    context = AsyncTaskContext if wf.is_async else TaskContext
    ctx = context(
        input=None,
        run_id=run.pk,
        task_name=run.task_name,
        version=run.version,
        queue=run.queue,
        trace_id=tracing.run_trace_id(run.trace_id, run.pk),
        priority=run.priority,
        attempt=run.attempts,
        state=state,
        logger=lambda: run_logger(run),
    )
    return Prepared(wf, ctx, handle)


def execute(run: WorkflowRun, wf: Workflow, ctx: TaskContext) -> str:
    """Drive the handler once and write the outcome. Returns what happened, for logs and tests.
    Observed: a span for the claim (observe/tracing.py) and the run's outcome counted
    (observe/metrics.py); a completion is both once written (`_completion_written`): a cancel
    may have won. An async workflow runs on an event loop of its own, this thread doing its
    engine work and plain step functions (bridge.in_caller): a worker uses `aexecute`."""
    if wf.is_async:
        return in_caller(functools.partial(aexecute, run, wf, ctx))
    with tracing.claim_span(ctx) as span:
        ctx._state.span = span
        try:
            outcome = _drive(run, wf, ctx)
        except BaseException:
            tracing.end_claim(span, None)
            raise
    if outcome != "completed":
        tracing.end_claim(span, outcome)
        metrics.record_run_outcome(run.task_name, outcome)
    return outcome


def _drive(run: WorkflowRun, wf: Workflow, ctx: TaskContext) -> str:
    ended = _before(run, ctx)
    if ended is not None:
        return ended
    try:
        ctx._load_input(wf.load_input(run.input))
        output = to_jsonable(_not_awaitable(wf, wf.fn(ctx)), f"the output of {wf.key}")
    except Suspend:
        return "suspended"
    except EngineUnavailable:
        raise  # the slot treats it as a database outage; nothing can be written now
    except BaseException as exc:  # noqa: BLE001 - every outcome of user code is recorded
        return _after_exception(run, wf, ctx, exc)
    return _after_return(run, wf, ctx, output)


async def aexecute(run: WorkflowRun, wf: Workflow, ctx: TaskContext, bridge: Bridge) -> str:
    """`execute` for an async workflow, on its event loop: the engine's parts go through
    `bridge` (bridge.py), the workflow's body is awaited on the loop."""
    with tracing.claim_span(ctx) as span:
        ctx._state.span = span
        try:
            outcome = await _adrive(run, wf, ctx, bridge)
        except BaseException:
            tracing.end_claim(span, None)
            raise
    if outcome != "completed":
        tracing.end_claim(span, outcome)
        metrics.record_run_outcome(run.task_name, outcome)
    return outcome


async def _adrive(run: WorkflowRun, wf: Workflow, ctx: TaskContext, bridge: Bridge) -> str:
    steps = ctx.step
    assert isinstance(steps, AsyncStepAPI)
    steps.bind(bridge)
    if _ends_before(run, ctx):  # else `_before` writes nothing: no trip off the loop
        return str(await steps.engine(_before, run, ctx))
    try:
        ctx._load_input(wf.load_input(run.input))
        output = await steps.body(wf.fn(ctx))
        steps.check_all_awaited()
        output = to_jsonable(output, f"the output of {wf.key}")
    except Suspend:
        return "suspended"
    except EngineUnavailable:
        raise  # the run's task treats it as a database outage (worker/async_runs.py)
    except BaseException as exc:  # noqa: BLE001 - every outcome of user code is recorded
        return str(await steps.engine(_after_exception, run, wf, ctx, exc))
    if _completes_in_memory(ctx):  # a hand-off to the group writer: no trip off the loop
        return _complete(run, ctx, output)
    return str(await steps.engine(_after_return, run, wf, ctx, output))


def _completes_in_memory(ctx: TaskContext) -> bool:
    """Whether the run's completion makes no statement on the caller's thread, so that an
    async run's loop may hand it off itself (`_complete`): a group writer takes it (the
    worker's, alive), and it is the plain completion: no abort or fatal error to record, no
    parent to wake in the same transaction, no deadline that could pass before it is
    written, no step its claim started that the run never reached (each of those writes on
    the caller's connection)."""
    state = ctx._state
    writer = state.lease.writer
    unreached_prestart = state.fresh and not state.started and state.prestarted is not None
    return (
        writer is not None
        and not unreached_prestart
        and not getattr(writer, "dead", True)
        and not state.handle.has_parent
        and state.lease.deadline_at is None
        and state.fatal is None
        and not ctx.abort_signal.aborted
    )


def _not_awaitable(wf: Workflow, output: Any) -> Any:
    """A plain workflow's output: an awaitable (a def that returns a coroutine) would never be
    awaited; its run fails at once saying what to write instead."""
    if not inspect.isawaitable(output):
        return output
    if inspect.iscoroutine(output):
        output.close()
    raise AsyncStepError(
        f"workflow {wf.key} is a plain function that returned an awaitable, which nothing"
        " would await: define it with async def (and await its steps)"
    )


def _ends_before(run: WorkflowRun, ctx: TaskContext) -> bool:
    """Whether `_before` ends the run (a cancel or a passed deadline): read in memory."""
    if ctx._state.handle.cancel_requested:
        return True
    return run.deadline_at is not None and clock.now() >= run.deadline_at


def _before(run: WorkflowRun, ctx: TaskContext) -> str | None:
    """Before the body: a cancel or a deadline already there ends the run (its outcome)."""
    state = ctx._state
    lease, handle = state.lease, state.handle
    if handle.cancel_requested:
        transitions.cancel_running_run(lease, has_parent=handle.has_parent)
        return "canceled"
    if run.deadline_at is not None and clock.now() >= run.deadline_at:
        passed = DeadlineExceededError("deadline passed")
        transitions.fail_run(lease, encode_error(passed), has_parent=handle.has_parent)
        observe_waits_ended_by_deadline(ctx)
        return "failed"
    return None


def _after_return(run: WorkflowRun, wf: Workflow, ctx: TaskContext, output: Any) -> str:
    state = ctx._state
    if ctx.abort_signal.aborted or state.fatal is not None:
        return _after_exception(run, wf, ctx, state.fatal or ctx.abort_signal.reason)
    return _complete(run, ctx, output)


def _complete(run: WorkflowRun, ctx: TaskContext, output: Any) -> str:
    """The body returned and nothing aborted it: write the completion. (An abort that comes
    after the look at it is as one that came after the completion was written.)"""
    state = ctx._state
    lease, handle = state.lease, state.handle
    state.first_step_begins(ctx.task_name, ctx.version, None)  # ends without one
    unreached = state.history.unreached()
    progress = handle.take_dirty_progress()
    written = transitions.complete_run(
        lease,
        output,
        unreached,
        has_parent=handle.has_parent,
        progress=progress,
        ended=functools.partial(_completion_written, run, state.span),
    )
    if written == "failed":  # it returned past its deadline: the run failed instead
        ctx.logger.error("run failed", error="DeadlineExceededError", why="deadline passed")
        return "failed"
    if unreached:
        ctx.logger.warning("completed without reaching recorded steps", unreached=unreached)
    return "completed"


def _completion_written(run: WorkflowRun, span: Any, status: str | None) -> None:
    """The completion's write is done (for a detached one, on the writer's thread): end the
    claim's span with what it wrote and count it (None: a detached write that failed, its run
    dropped; nothing to count). A cancel that committed after the handler's last look at it
    won: the run ended canceled, its output not kept. It holds the run and the span, not the
    run's context: holding the context until the writer settled cost a worker about 20 us of
    CPU a run (bench/PROFILE.md, eleventh session), likely the cyclic collector's, as contexts
    then outlived its young generation."""
    try:  # observability only: it must never fail the writer that reports it
        tracing.end_claim(span, status)
        if status is None:
            return
        metrics.record_run_outcome(run.task_name, status)
        if status == "canceled":
            run_logger(run).info("run canceled", why="the cancel committed as the handler returned")
    except Exception:  # noqa: BLE001 - a broken log handler cannot be logged to either
        pass


def _after_exception(run: WorkflowRun, wf: Workflow, ctx: TaskContext, exc: Any) -> str:
    state = ctx._state
    lease, handle = state.lease, state.handle
    reason = ctx.abort_signal.reason
    if isinstance(reason, WorkerStopping):
        # A graceful stop aborted the step: give the run back now rather than let it wait for
        # its lease to expire (the abort is not the step's failure and does not count).
        transitions.requeue_run(lease, clock.now(), progress=state.progress_to_carry())
        ctx.logger.info("run handed back", why=str(reason))
        return "handed-back"
    if isinstance(reason, LeaseLostError) or isinstance(exc, LeaseLostError):
        ctx.logger.warning("lease lost; dropping the run", error=str(reason or exc))
        return "lease-lost"
    state.first_step_begins(ctx.task_name, ctx.version, None)  # ends without one
    if isinstance(reason, TaskCanceledError) or (
        handle.cancel_requested and isinstance(exc, TaskCanceledError)
    ):
        transitions.cancel_running_run(lease, has_parent=handle.has_parent)
        ctx.logger.info("run canceled")
        return "canceled"
    if isinstance(reason, DeadlineExceededError):
        exc = reason
    if state.fatal is not None:
        exc = state.fatal
    if not isinstance(exc, BaseException):
        exc = RuntimeError(str(exc))
    error = encode_error(exc)
    failures = run.failures + 1
    if (
        state.fatal is None
        and not isinstance(exc, DeadlineExceededError)
        and wf.retry.is_retryable(exc)
        and failures < wf.retry.max_attempts
    ):
        delay = wf.retry.delay(failures)
        transitions.requeue_run(
            lease,
            clock.now() + timedelta(seconds=delay),
            error=error,
            count_failure=True,
            progress=state.progress_to_carry(),
        )
        ctx.logger.warning("workflow failed, retrying", failures=failures, error=str(exc))
        return "retrying"
    transitions.fail_run(
        lease, error, has_parent=handle.has_parent, progress=state.progress_to_carry()
    )
    ctx.logger.error("run failed", error=error["type"], message=error["message"])
    return "failed"
