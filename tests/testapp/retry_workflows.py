"""Workflows an operator retries: a step fails until a gate row exists
(tests/engine/transitions/test_retry.py)."""

from __future__ import annotations

from pydantic import BaseModel

from tasks_engine import RetryPolicy, TaskContext, workflow

from .models import Marker, SideEffect


class Gate(BaseModel):
    key: str = "gated"
    gate_step: str = "b"  # the step that fails while the gate is closed
    wait_fact: bool = False  # wait for a fact "go" between a and b


class GateClosed(Exception):
    pass


def gate_is_open(key: str) -> bool:
    return Marker.objects.filter(key=f"{key}:open").exists()


ONCE = RetryPolicy(max_attempts=1)


@workflow(name="gated", input=Gate, step_retry=ONCE)
def gated(ctx: TaskContext) -> dict:
    return gated_steps(ctx)


@workflow(
    name="gated_retrying",
    input=Gate,
    step_retry=ONCE,
    retry=RetryPolicy(max_attempts=2, initial_interval=0.0),
)
def gated_retrying(ctx: TaskContext) -> dict:
    return gated_steps(ctx)


def gated_steps(ctx: TaskContext) -> dict:
    key = ctx.input.key

    def body(step: str) -> str:
        SideEffect.objects.create(key=f"{key}:{step}", run_id=ctx.run_id)
        if step == ctx.input.gate_step and not gate_is_open(key):
            raise GateClosed(f"gate {key} is closed")
        return step

    done = [ctx.step.run("a", lambda: body("a"))]
    if ctx.input.wait_fact:
        done.append(ctx.step.wait_for_fact("go"))
    done += [ctx.step.run("b", lambda: body("b")), ctx.step.run("c", lambda: body("c"))]
    return {"done": done}
