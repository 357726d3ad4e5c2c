"""Workflows for the promises the adversarial review broke (issue: every promise under
adversarial schedules): cancel racing a park or a child, poisoned values, engine outages,
workflow retries of children, the op ledger across runs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from pydantic import BaseModel

import tasks_engine
from tasks_engine import NonRetryableError, RetryPolicy, TaskContext, workflow
from tasks_engine.models import WorkflowRun

from .models import SideEffect


class Then(BaseModel):
    then: str = "sleep"  # what the run does after its first step: sleep | fact | child | step


def _once(ctx: TaskContext, key: str, value: Any = None) -> Any:
    SideEffect.objects.create(key=key, run_id=ctx.run_id)
    return value


@workflow(name="cancel_then_park", input=Then)
def cancel_then_park(ctx: TaskContext) -> str:
    """Its first step cancels the run (as an operator could at that moment); then it parks."""
    ctx.step.run("cancel-me", lambda: tasks_engine.cancel(ctx.run_id, "from the step"))
    if ctx.input.then == "sleep":
        ctx.step.sleep("week", dt.timedelta(days=7))
    elif ctx.input.then == "step":
        ctx.step.run("after", lambda: _once(ctx, "after"))
    elif ctx.input.then == "fact":
        ctx.step.wait_for_fact("never")
    else:
        ctx.step.run_child("child_echo", {"value": 1}, name="kid")
    return "parked and woke"


@workflow(name="swallows_suspension")
def swallows_suspension(ctx: TaskContext) -> str:
    """User code that catches Exception around a wait must not swallow the engine's outage."""
    try:
        ctx.step.sleep("nap", 60)
    except Exception as exc:  # noqa: BLE001 - the point of the test
        return f"caught {type(exc).__name__}"
    return "slept"


class Value(BaseModel):
    kind: str


def bad_value(kind: str) -> Any:
    return {
        "datetime": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "set": {1, 2},
        "nan": float("nan"),
        "inf": [1.0, float("inf")],
        "nul": {"name": "a\x00b"},
        "nul-key": {"a\x00": 1},
        "deep": deep(50_000),
        "large": {"blob": "x" * 70_000},  # past the tests' MAX_PAYLOAD_BYTES of 64 KiB
        "deep-model": Anything(data=deep(600)),  # past pydantic's own bound on nesting
    }[kind]


def deep(levels: int) -> Any:
    """Lists nested `levels` deep ([] is one level)."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@workflow(name="bad_step_result", input=Value)
def bad_step_result(ctx: TaskContext) -> Any:
    return ctx.step.run("produce", lambda: _once(ctx, "produce", bad_value(ctx.input.kind)))


@workflow(name="bad_output_after_sleep", input=Value)
def bad_output_after_sleep(ctx: TaskContext) -> Any:
    ctx.step.sleep("nap", 1)
    return bad_value(ctx.input.kind)


class Stamped(BaseModel):
    when: dt.datetime
    id: uuid.UUID
    reading: float = 0.0


STAMP = Stamped(when=dt.datetime(2026, 1, 1, 3, tzinfo=dt.UTC), id=uuid.UUID(int=5))


@workflow(name="model_results")
def model_results(ctx: TaskContext) -> Any:
    """A step and the run return pydantic models with a datetime and a UUID: stored in JSON mode,
    as pydantic writes them; the step's value comes back the same on replay, past a sleep."""
    first = ctx.step.run("stamp", lambda: STAMP)
    ctx.step.sleep("nap", 1)
    return Stamped(when=first["when"], id=first["id"], reading=1.5)


FLOATS = [1e20, -1.5e17, -0.0, 1e-07, 2.5]  # Python writes the first two with an exponent


@workflow(name="float_results")
def float_results(ctx: TaskContext) -> Any:
    """A step returns floats, plain and in a model: the run reports what the step gave before
    and after a sleep (the second pass replays it from the store)."""
    plain = ctx.step.run("plain", lambda: FLOATS)
    model = ctx.step.run("model", lambda: Stamped(when=STAMP.when, id=STAMP.id, reading=1e20))
    first = ctx.step.run("first", lambda: [repr(plain), repr(model["reading"])])  # pass 1
    ctx.step.sleep("nap", 1)
    return {"first": first, "replayed": [repr(plain), repr(model["reading"])]}


@workflow(name="always_fails_step", step_retry=RetryPolicy(max_attempts=10**6, initial_interval=0))
def always_fails_step(ctx: TaskContext) -> None:
    """A step that fails on every attempt, retried far past MAX_STEP_ATTEMPTS_PER_RUN."""

    def fails() -> None:
        raise ValueError("fails again")

    ctx.step.run("fails", fails)


class Reading(BaseModel):
    celsius: float
    label: str = ""


@workflow(name="reading", input=Reading)
def reading(ctx: TaskContext) -> float:
    return ctx.input.celsius


@workflow(name="failing_child")
def failing_child(ctx: TaskContext) -> str:
    """Fails on its first run (per parent pass): a parent's workflow retry must start a new one."""
    SideEffect.objects.create(key="child-ran", run_id=ctx.run_id)
    if SideEffect.objects.filter(key="child-ran").count() == 1:
        raise ValueError("first child fails")
    return "second child ok"


@workflow(name="retrying_parent", retry=RetryPolicy(max_attempts=2, initial_interval=0.0))
def retrying_parent(ctx: TaskContext) -> str:
    return ctx.step.run_child("failing_child", {}, name="kid")


@workflow(name="long_retry_budget", step_retry=RetryPolicy(max_attempts=5000, initial_interval=0))
def long_retry_budget(ctx: TaskContext) -> str:
    return ctx.step.run("flaky", lambda: _once(ctx, "flaky", "ok"))


class Op(BaseModel):
    op_key: str


@workflow(name="op_user", input=Op)
def op_user(ctx: TaskContext) -> Any:
    return ctx.with_attempt_token(ctx.input.op_key, lambda info: _once(ctx, "op-fn", "done"))


class Late(BaseModel):
    cancel: str = "self"  # "self", or "parent": whose cancel commits as the handler returns


@workflow(name="canceled_as_it_returns", input=Late)
def canceled_as_it_returns(ctx: TaskContext) -> str:
    """Its step is done and its handler returns; a cancel commits in between (here, from the
    handler itself, after its last look at the cancel flag): the cancel must win."""
    ctx.step.run("work", lambda: "done")
    target = ctx.run_id
    if ctx.input.cancel == "parent":
        parent = WorkflowRun.objects.get(pk=ctx.run_id).parent_run_id
        assert parent is not None
        target = parent
    tasks_engine.cancel(target, reason="late")
    return "finished"


@workflow(name="parent_of_late_child")
def parent_of_late_child(ctx: TaskContext) -> Any:
    return ctx.step.run_child("canceled_as_it_returns", {"cancel": "parent"}, name="child")


@workflow(name="canceled_as_it_fails")
def canceled_as_it_fails(ctx: TaskContext) -> str:
    """A cancel commits, then the handler raises for good: the cancel must win."""
    tasks_engine.cancel(ctx.run_id, reason="late")
    raise NonRetryableError("broke at the end")


async def _fetch() -> dict:
    return {"fetched": True}


@workflow(name="async_step_function", input=Value)
def async_step_function(ctx: TaskContext) -> Any:
    """kind "function": an async def as the step; "lambda": a plain function returning a
    coroutine (never awaited by a plain workflow either way)."""
    fn = _fetch if ctx.input.kind == "function" else (lambda: _fetch())
    return ctx.step.run("fetch", fn)


class Anything(BaseModel):
    data: Any = None


@workflow(name="anything", input=Anything)
def anything(ctx: TaskContext) -> Any:
    return ctx.input.data
