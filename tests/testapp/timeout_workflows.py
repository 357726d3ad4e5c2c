"""Workflows for step timeouts, default deadlines, `ctx.patched` and replay-check.

`PATCH_CODE` chooses which code this process runs: "old" (default) or "new", read from the
environment variable TASKS_TEST_PATCH_CODE at import (worker processes started with either
play a deploy), and flipped by in-process tests.
"""

from __future__ import annotations

import math
import os
import time
from datetime import timedelta

from pydantic import BaseModel

from tasks_engine import NonRetryableError, RetryPolicy, StepTimeoutError, TaskContext, workflow

from .models import Marker, SideEffect
from .workflows import effect

PATCH_CODE = {"code": os.environ.get("TASKS_TEST_PATCH_CODE", "old")}


class Timed(BaseModel):
    timeout: float = 0.5
    hangs: int = 1  # how many attempts hang past the timeout (later ones return at once)
    hold: float = 30.0  # how long a hanging attempt runs when it ignores its abort
    watch: bool = True  # the body watches ctx.abort_signal (else it ignores it)
    max_attempts: int = 3
    fire_in_process: bool = False  # in-process tests play the heartbeat: fire the timer now
    release: str = ""  # a body that ignores its abort runs until a Marker with this key exists


def _attempts(ctx: TaskContext, key: str) -> int:
    return SideEffect.objects.filter(key=key, run_id=ctx.run_id).count()


@workflow(name="timed_step", input=Timed)
def timed_step(ctx: TaskContext) -> dict:
    inp = ctx.input

    def slow() -> dict:
        n = _attempts(ctx, "slow")
        effect(ctx, "slow")
        if n >= inp.hangs:
            return {"attempt": n + 1}
        if inp.fire_in_process:
            timer = ctx._state.handle.timer
            assert timer is not None
            timer.fire(math.inf, ctx.abort_signal.abort)
        if inp.watch:
            if ctx.abort_signal.wait(inp.hold):
                raise ctx.abort_signal.reason or RuntimeError("aborted without a reason")
        elif inp.release:
            while not Marker.objects.filter(key=inp.release).exists():
                time.sleep(0.05)
        else:
            end = time.monotonic() + inp.hold
            while time.monotonic() < end:
                time.sleep(0.05)
        effect(ctx, "slow-returned")  # only a body that outlived its timeout gets here
        return {"attempt": n + 1, "late": True}

    retry = RetryPolicy(max_attempts=inp.max_attempts, initial_interval=0.05, max_interval=0.1)
    try:
        got = ctx.step.run("slow", slow, retry=retry, timeout=inp.timeout)
    except StepTimeoutError as exc:
        got = {"timed_out": str(exc)}
    # The next step must not see the timed-out step's abort.
    after = ctx.step.run("after", lambda: {"aborted": ctx.abort_signal.aborted})
    return {"slow": got, "after": after}


class AtomicTimed(BaseModel):
    timeout: float = 0.2
    hold: float = 0.6  # the body ignores its abort and returns after this long


@workflow(name="atomic_timed_step", input=AtomicTimed)
def atomic_timed_step(ctx: TaskContext) -> str:
    """An atomic step that writes, then outlives its timeout: its write must not commit."""

    def write() -> str:
        Marker.objects.create(key=f"atomic-timed:{ctx.run_id}", value="written")
        time.sleep(ctx.input.hold)
        return "written"

    try:
        return ctx.step.run(
            "write",
            write,
            atomic=True,
            timeout=ctx.input.timeout,
            retry=RetryPolicy(max_attempts=1),
        )
    except StepTimeoutError as exc:
        return f"timed out: {exc}"


class Sleep(BaseModel):
    seconds: float = 3600.0


@workflow(name="deadline_sleeper", input=Sleep, deadline=timedelta(seconds=2))
def deadline_sleeper(ctx: TaskContext) -> str:
    ctx.step.run("before", lambda: effect(ctx, "before"))
    ctx.step.sleep("nap", ctx.input.seconds)
    ctx.step.run("after", lambda: effect(ctx, "after"))
    return "woke"


class ChildWait(BaseModel):
    timeout: float = 60.0


@workflow(name="never_finishing_child")
def never_finishing_child(ctx: TaskContext) -> None:
    ctx.step.wait_for_fact("never")


@workflow(name="child_with_timeout", input=ChildWait)
def child_with_timeout(ctx: TaskContext) -> dict:
    try:
        ctx.step.run_child("never_finishing_child", {}, name="kid", timeout=ctx.input.timeout)
        got = "finished"
    except StepTimeoutError as exc:
        got = f"timeout: {exc}"
    ctx.step.sleep("after", 1)  # forces a replay: the timeout must be raised again
    return {"got": got}


@workflow(name="patched_flow")
def patched_flow(ctx: TaskContext) -> dict:
    """Old code: a, b, wait for "go". New code: a, then c instead of b (patched), then the
    wait. A run mid-way (parked on the wait) under old code keeps its old path."""
    ctx.step.run("a", lambda: effect(ctx, "a"))
    if PATCH_CODE["code"] == "new" and ctx.patched("use-c"):
        path = ctx.step.run("c", lambda: effect(ctx, "c") and "new")
    else:
        path = ctx.step.run("b", lambda: effect(ctx, "b") and "old")
    ctx.step.wait_for_fact("go")
    return {"path": path}


@workflow(name="kind_changes")
def kind_changes(ctx: TaskContext) -> str:
    """Old code: step "b" is a function; new code makes it a sleep (a changed step kind)."""
    ctx.step.run("a", lambda: effect(ctx, "a"))
    if PATCH_CODE["code"] == "new":
        ctx.step.sleep("b", 1)
    else:
        ctx.step.run("b", lambda: effect(ctx, "b"))
    ctx.step.wait_for_fact("go")
    return "done"


@workflow(name="step_inserted")
def step_inserted(ctx: TaskContext) -> str:
    """New code inserts step "x" before "b" without `patched`: recorded "b" is not reached."""
    ctx.step.run("a", lambda: effect(ctx, "a"))
    if PATCH_CODE["code"] == "new":
        ctx.step.run("x", lambda: effect(ctx, "x"))
    ctx.step.run("b", lambda: effect(ctx, "b"))
    ctx.step.wait_for_fact("go")
    return "done"


@workflow(name="fails_at_b")
def fails_at_b(ctx: TaskContext) -> str:
    """Step "b" fails for good (the run fails: an operator may retry it). New code inserts
    step "x" before "b" without `patched`."""
    ctx.step.run("a", lambda: effect(ctx, "a"))
    if PATCH_CODE["code"] == "new":
        ctx.step.run("x", lambda: effect(ctx, "x"))

    def b() -> None:
        effect(ctx, "b")
        raise NonRetryableError("boom")

    ctx.step.run("b", b)
    return "done"


@workflow(name="parked_after_a")
def parked_after_a(ctx: TaskContext) -> str:
    """Old code: a, parked on fact "go", then b. New code: "removed" drops a, "renamed" calls
    it a2, "moved" runs it after the wait."""
    code = PATCH_CODE["code"]
    if code == "renamed":
        ctx.step.run("a2", lambda: effect(ctx, "a2"))
    elif code not in ("removed", "moved"):
        ctx.step.run("a", lambda: effect(ctx, "a"))
    ctx.step.wait_for_fact("go")
    if code == "moved":
        ctx.step.run("a", lambda: effect(ctx, "a"))
    ctx.step.run("b", lambda: effect(ctx, "b"))
    return "done"


@workflow(name="caught_then_fails", retry=RetryPolicy(max_attempts=2, initial_interval=3600))
def caught_then_fails(ctx: TaskContext) -> str:
    """Pass 1: step x fails for good, caught, y runs, the pass fails; the run's retry (an hour
    later) runs x again: y, recorded after x, is not a step passed over before it."""

    def x() -> None:
        raise RuntimeError("x fails")

    try:
        ctx.step.run("x", x, retry=RetryPolicy(max_attempts=1))
    except RuntimeError:
        ctx.step.run("y", lambda: effect(ctx, "y"))
        raise RuntimeError("the pass fails") from None
    return "done"


@workflow(name="long_then_short_timeout")
def long_then_short_timeout(ctx: TaskContext) -> dict:
    """A step with a timeout far past threading.TIMEOUT_MAX on some platforms (1e10 s), then
    one that times out after 0.3 s: the second must still be aborted."""
    once = RetryPolicy(max_attempts=1)

    def long() -> str:
        time.sleep(0.2)  # long enough for the timeout thread to see its timer
        return "done"

    first = ctx.step.run("long", long, retry=once, timeout=1e10)

    def short() -> str:
        ctx.abort_signal.wait(3.0)
        return "not aborted"

    try:
        second = ctx.step.run("short", short, retry=once, timeout=0.3)
    except StepTimeoutError as exc:
        second = str(exc)
    return {"long": first, "short": second}
