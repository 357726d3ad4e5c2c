"""Workflows the tests drive, in-process and in real worker processes."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from functools import partial

from pydantic import BaseModel

from tasks_engine import NonRetryableError, RetryPolicy, TaskContext, workflow

from .models import Marker, SideEffect


def effect(ctx: TaskContext, key: str) -> dict:
    SideEffect.objects.create(key=key, run_id=ctx.run_id, worker=os.environ.get("WORKER_TAG", ""))
    return {"key": key}


class N(BaseModel):
    n: int = 0


class Sleepy(BaseModel):
    seconds: float = 0.0
    tag: str = ""


class Flaky(BaseModel):
    fail_times: int = 0
    key: str = "flaky"


class AppError(Exception):
    pass


@workflow(name="noop", input=N)
def noop(ctx: TaskContext) -> dict:
    ctx.step.run("only", lambda: effect(ctx, f"noop:{ctx.input.n}"))
    return {"n": ctx.input.n}


@workflow(name="tagged", input=N, tags={"team": "media", "tier": "1"})
def tagged(ctx: TaskContext) -> int:
    """Carries default tags (enqueue's own go over them)."""
    return ctx.input.n


@workflow(name="three_steps", input=N)
def three_steps(ctx: TaskContext) -> list:
    a = ctx.step.run("a", lambda: effect(ctx, "a"))
    b = ctx.step.run("b", lambda: effect(ctx, "b"))
    c = ctx.step.run("c", lambda: effect(ctx, "c"))
    return [a["key"], b["key"], c["key"]]


@workflow(name="repeat_names")
def repeat_names(ctx: TaskContext) -> list:
    return [ctx.step.run("fetch", partial(int, i)) for i in range(3)]


@workflow(name="slow_middle", input=Sleepy)
def slow_middle(ctx: TaskContext) -> str:
    """first (fast), middle (sleeps `seconds` in its body), last (fast)."""
    ctx.step.run("first", lambda: effect(ctx, "first"))

    def middle() -> dict:
        effect(ctx, "middle-start")
        deadline = time.monotonic() + ctx.input.seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return effect(ctx, "middle-end")

    ctx.step.run("middle", middle)
    ctx.step.run("last", lambda: effect(ctx, "last"))
    return "done"


@workflow(
    name="flaky",
    input=Flaky,
    step_retry=RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.05),
)
def flaky(ctx: TaskContext) -> str:
    def body() -> str:
        tries = SideEffect.objects.filter(key=ctx.input.key, run_id=ctx.run_id).count()
        effect(ctx, ctx.input.key)
        if tries < ctx.input.fail_times:
            raise AppError(f"failure {tries + 1}")
        return "ok"

    return ctx.step.run("body", body)


@workflow(
    name="catcher", step_retry=RetryPolicy(max_attempts=2, initial_interval=0.01, max_interval=0.01)
)
def catcher(ctx: TaskContext) -> dict:
    def boom() -> None:
        effect(ctx, "boom")
        raise AppError("always broken")

    try:
        ctx.step.run("boom", boom)
        caught = None
    except AppError as exc:
        caught = f"{type(exc).__name__}: {exc}"
    ctx.step.sleep("pause", 0.0)
    return {"caught": caught}


@workflow(name="fatal")
def fatal(ctx: TaskContext) -> None:
    def body() -> None:
        effect(ctx, "fatal")
        raise NonRetryableError("no point retrying")

    ctx.step.run("body", body)


@workflow(name="swallow")
def swallow(ctx: TaskContext) -> str:
    """`except Exception` around a sleep must not swallow the suspension."""
    try:
        ctx.step.sleep("nap", 3600)
    except Exception:  # noqa: BLE001
        return "swallowed"
    return "woke"


@workflow(name="run_retry", retry=RetryPolicy(max_attempts=2, initial_interval=0.0))
def run_retry(ctx: TaskContext) -> str:
    ctx.step.run("stable", lambda: effect(ctx, "stable"))

    def shaky() -> str:
        effect(ctx, "shaky")
        if SideEffect.objects.filter(key="shaky", run_id=ctx.run_id).count() == 1:
            raise AppError("first pass fails")
        return "ok"

    return ctx.step.run("shaky", shaky, retry=RetryPolicy(max_attempts=1))


@workflow(name="atomic_marker", input=N)
def atomic_marker(ctx: TaskContext) -> str:
    def write() -> str:
        Marker.objects.create(key=f"atomic:{ctx.run_id}", value=str(ctx.input.n))
        return "written"

    return ctx.step.run("write", write, atomic=True)


@workflow(name="sleeper", input=Sleepy)
def sleeper(ctx: TaskContext) -> str:
    ctx.step.run("before", lambda: effect(ctx, "before"))
    ctx.step.sleep("nap", timedelta(seconds=ctx.input.seconds))
    ctx.step.run("after", lambda: effect(ctx, "after"))
    return "rested"


@workflow(name="a", version=1)
def a_v1(ctx: TaskContext) -> int:
    return 1


@workflow(name="a", version=2)
def a_v2(ctx: TaskContext) -> int:
    return 2


@workflow(name="b")
def b_v1(ctx: TaskContext) -> str:
    return "b"


@workflow(name="many_steps", input=N)
def many_steps(ctx: TaskContext) -> int:
    for i in range(ctx.input.n):
        ctx.step.run("s", partial(int, i))
    return ctx.input.n


@workflow(name="crasher", step_retry=RetryPolicy(max_attempts=2, initial_interval=0.01))
def crasher(ctx: TaskContext) -> str:
    """Its step kills the worker process every time (used by process tests)."""

    def die() -> None:
        effect(ctx, "crash")
        os.kill(os.getpid(), 9)

    ctx.step.run("die", die)
    return "unreachable"


from . import process_workflows  # noqa: E402, F401 - workflows of the process tests


class FirstStep(BaseModel):
    first: str = "a"  # a step's name, "sleep" for a durable sleep, "" for no step at all


@workflow(name="first_step_varies", input=FirstStep)
def first_step_varies(ctx: TaskContext) -> dict:
    """Begins with the step its input names, a sleep, or no step: transitions/first_steps.py's
    guess of its first step can be wrong."""
    first = ctx.input.first
    if not first:
        return {"steps": 0}
    if first == "sleep":
        ctx.step.sleep("nap", 0)
    else:
        ctx.step.run(first, lambda: first)
    ctx.step.run("last", lambda: "last")
    return {"steps": 2}
