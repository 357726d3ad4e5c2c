"""Workflows the benchmarks run: a no-op single step and a ten-step workflow."""

from __future__ import annotations

from datetime import timedelta
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


# bench/key_flow.py: enqueues with a debounce key (a window per key) against without.
@workflow(
    name="bench_debounced",
    debounce=timedelta(seconds=60),
    debounce_key=lambda inp: str(inp.get("k", "")) or "none",
)
def bench_debounced(ctx: TaskContext) -> None:
    ctx.step.run("noop", lambda: None)
