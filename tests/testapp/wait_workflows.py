"""Workflows that wait: facts, child runs, cancel-aware steps."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from pydantic import BaseModel

from tasks_engine import (
    FactTimeoutError,
    NonRetryableError,
    RetryPolicy,
    TaskContext,
    clock,
    workflow,
)

from .models import Marker, SideEffect


class Waits(BaseModel):
    count: int = 1
    timeout: float | None = None


class Child(BaseModel):
    value: int = 0
    fail: bool = False
    sleep: float = 0.0


@workflow(name="fact_waiter", input=Waits)
def fact_waiter(ctx: TaskContext) -> list:
    return [
        ctx.step.wait_for_fact("item", timeout=ctx.input.timeout) for _ in range(ctx.input.count)
    ]


@workflow(name="fact_timeout")
def fact_timeout(ctx: TaskContext) -> dict:
    try:
        ctx.step.wait_for_fact("never", timeout=timedelta(seconds=5))
        got = "fact"
    except FactTimeoutError as exc:
        got = f"timeout: {exc}"
    ctx.step.sleep("after", 1)  # forces a replay: the timeout must be raised again
    return {"got": got}


@workflow(name="fact_until_deadline")
def fact_until_deadline(ctx: TaskContext) -> dict:
    """Waits until a deadline recorded by a step, as UMT's acquire does: each pass passes the
    time left, so the pass that wakes at the deadline passes 0."""
    deadline = ctx.step.run("deadline", lambda: (clock.now() + timedelta(seconds=20)).isoformat())
    left = max((datetime.fromisoformat(deadline) - clock.now()).total_seconds(), 0.0)
    try:
        ctx.step.wait_for_fact("never", timeout=left)
    except FactTimeoutError as exc:
        return {"got": str(exc)}
    return {"got": "fact"}


@workflow(name="fact_check")
def fact_check(ctx: TaskContext) -> object:
    def ready() -> object:
        row = Marker.objects.filter(key=f"ready:{ctx.run_id}").first()
        return {"value": row.value} if row else None

    return ctx.step.wait_for_fact("ready", check=ready, check_interval=10)


@workflow(name="child_echo", input=Child)
def child_echo(ctx: TaskContext) -> dict:
    if ctx.input.sleep:
        ctx.step.sleep("nap", ctx.input.sleep)
    if ctx.input.fail:
        raise ValueError(f"child refused {ctx.input.value}")
    return {"double": ctx.input.value * 2}


@workflow(name="parent", input=Child)
def parent(ctx: TaskContext) -> dict:
    out = ctx.step.run_child("child_echo", ctx.input.model_dump(), name="kid")
    return {"child": out}


@workflow(name="parent_catches", input=Child)
def parent_catches(ctx: TaskContext) -> str:
    try:
        ctx.step.run_child("child_echo", ctx.input.model_dump(), name="kid")
    except ValueError as exc:
        return f"caught: {exc}"
    return "no error"


@workflow(name="abortable")
def abortable(ctx: TaskContext) -> str:
    """A step that loops on the abort signal; the next step must never run after a cancel."""

    def loop() -> str:
        SideEffect.objects.create(key="loop-start", run_id=ctx.run_id)
        while not ctx.abort_signal.wait(0.05):
            pass
        ctx.raise_if_canceled()
        return "stopped"

    ctx.step.run("loop", loop)
    ctx.step.run("next", lambda: SideEffect.objects.create(key="next", run_id=ctx.run_id).pk)
    return "finished"


@workflow(name="busy_step")
def busy_step(ctx: TaskContext) -> str:
    def body() -> str:
        SideEffect.objects.create(key="busy", run_id=ctx.run_id)
        time.sleep(0.2)
        return "ok"

    ctx.step.run("body", body)
    return "done"


class Soak(BaseModel):
    step_ms: int = 50


# Interrupted attempts count against a step's retries (a step that kills its worker must end),
# so a soak that SIGKILLs a random worker every 2 s gives its steps room for bad luck.
@workflow(
    name="soak",
    input=Soak,
    step_retry=RetryPolicy(max_attempts=10, initial_interval=0.1, max_interval=1.0),
)
def soak(ctx: TaskContext) -> str:
    """Three steps: a plain one, a fenced external effect, an atomic database write."""
    pause = ctx.input.step_ms / 1000

    def prepare() -> str:
        time.sleep(pause)
        SideEffect.objects.create(key="soak-prepare", run_id=ctx.run_id)
        return "prepared"

    def external(info) -> dict:
        time.sleep(pause)
        return {"resumed": info.resumed}

    def fenced() -> dict:
        return ctx.with_attempt_token(
            f"soak:{ctx.run_id}",
            external,
            commit=lambda result: Marker.objects.create(
                key=f"soak:{ctx.run_id}", value=str(result["resumed"])
            ),
        )

    def atomic() -> str:
        time.sleep(pause)
        Marker.objects.create(key=f"soak-atomic:{ctx.run_id}")
        return "written"

    ctx.step.run("prepare", prepare)
    ctx.step.run("fenced", fenced)
    ctx.step.run("atomic", atomic, atomic=True)
    return "ok"


class Fenced(BaseModel):
    seconds: float = 3.0


@workflow(name="fenced_slow", input=Fenced)
def fenced_slow(ctx: TaskContext) -> dict:
    """The op's outside-world part is slow, so a test can SIGSTOP the worker inside it."""
    import os

    def outside(info) -> dict:
        SideEffect.objects.create(
            key="op-start", run_id=ctx.run_id, worker=os.environ.get("WORKER_TAG", "")
        )
        time.sleep(ctx.input.seconds)
        return {"by": os.environ.get("WORKER_TAG", ""), "resumed": info.resumed}

    def op() -> dict:
        # One marker per committing worker (its tag in the key): a stale commit that fencing
        # let through would add a row beside the rescuer's, not be refused by the unique key.
        return ctx.with_attempt_token(
            f"fenced:{ctx.run_id}",
            outside,
            commit=lambda r: Marker.objects.create(
                key=f"fenced:{ctx.run_id}:{r['by']}", value=r["by"]
            ),
        )

    return ctx.step.run("op", op)


@workflow(name="stubborn")
def stubborn(ctx: TaskContext) -> str:
    """A step that ignores its abort signal for a long time."""

    def body() -> str:
        SideEffect.objects.create(key="stubborn-start", run_id=ctx.run_id)
        time.sleep(30)
        return "late"

    ctx.step.run("body", body)
    ctx.step.run("after", lambda: SideEffect.objects.create(key="after", run_id=ctx.run_id).pk)
    return "done"


@workflow(name="slow_between_steps")
def slow_between_steps(ctx: TaskContext) -> str:
    """Long user code between two steps: the first checkpoint must not wait for the second."""
    ctx.step.run("first", lambda: "one")
    SideEffect.objects.create(key="between", run_id=ctx.run_id)
    time.sleep(4)
    ctx.step.run("second", lambda: "two")
    return "done"


@workflow(name="quick_progress")
def quick_progress(ctx: TaskContext) -> str:
    def body() -> str:
        for i in range(5):
            ctx.progress(i + 1, 5, f"chunk {i + 1}/5")
        return "ok"

    return ctx.step.run("body", body)


class Parks(BaseModel):
    how: str  # "sleep", "fact", "retry" (a step's backoff), "child" or "fail"


@workflow(name="progress_then_park", input=Parks)
def progress_then_park(ctx: TaskContext) -> str:
    """Reports progress, then lets the run go at once: the report must not be lost with it."""
    ctx.progress(3, 10, "three")
    how = ctx.input.how
    if how == "sleep":
        ctx.step.sleep("nap", 3600)
    elif how == "fact":
        ctx.step.wait_for_fact("go")
    elif how == "child":
        ctx.step.run_child("progress_then_park", {"how": "fact"}, name="child")
    elif how == "fail":
        raise NonRetryableError("gave up at three")
    else:

        def flaky() -> str:
            if not SideEffect.objects.filter(key="flaky-ran", run_id=ctx.run_id).exists():
                SideEffect.objects.create(key="flaky-ran", run_id=ctx.run_id)
                raise RuntimeError("first try fails")
            return "ok"

        ctx.step.run("flaky", flaky, retry=RetryPolicy(max_attempts=2, initial_interval=600))
    ctx.progress(10, 10, "done")
    return how


class Says(BaseModel):
    message: str


@workflow(name="progress_says", input=Says)
def progress_says(ctx: TaskContext) -> str:
    """Reports progress with the given message, then waits: the message stays on the run."""
    ctx.progress(1, 2, ctx.input.message)
    return str(ctx.step.wait_for_fact("go"))


# A duration a workflow gives a wait, by name (its input is JSON, which holds no NaN).
DURATIONS: dict[str, object] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "negative": -1,
    "zero": 0,
    "true": True,
    "text": "5",
    "huge": 1e12,  # past the year 9999 from now
    "a_minute": timedelta(minutes=1),
}


class BadWait(BaseModel):
    call: str  # sleep | fact_timeout | check_interval | child_timeout
    value: str  # a key of DURATIONS


@workflow(name="wait_with_duration", input=BadWait)
def wait_with_duration(ctx: TaskContext) -> object:
    value: object = DURATIONS[ctx.input.value]
    step = ctx.step
    if ctx.input.call == "sleep":
        step.sleep("nap", value)  # type: ignore[arg-type]
        return "slept"
    if ctx.input.call == "fact_timeout":
        try:
            return step.wait_for_fact("go", timeout=value)  # type: ignore[arg-type]
        except FactTimeoutError:
            return "timed out"
    if ctx.input.call == "check_interval":
        return step.wait_for_fact("go", check=lambda: None, check_interval=value)  # type: ignore[arg-type]
    return step.run_child("child_echo", {"value": 1}, name="child", timeout=value)  # type: ignore[arg-type]
