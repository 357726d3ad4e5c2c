"""Workflows the benchmarks run: a no-op single step and a ten-step workflow."""

from __future__ import annotations

from functools import partial

from tasks_engine import TaskContext, workflow


@workflow(name="bench_noop")
def bench_noop(ctx: TaskContext) -> None:
    ctx.step.run("noop", lambda: None)


@workflow(name="bench_ten_steps")
def bench_ten_steps(ctx: TaskContext) -> int:
    total = 0
    for i in range(10):
        total += ctx.step.run(f"step-{i}", partial(int, i))
    return total
