"""`bench_pickup`: a one-step job whose step, first thing, appends "k wall-clock-start" to
$BENCH_LATENCY_FILE; the enqueuer takes the commit time of job k itself, so pickup latency is
measured the same way for every engine (bench/peers/harness.py does the same for the peers).

A worker started by bench/common.py logs which tasks_engine it imported, so a baseline run
can show that the checkout's code, not the editable install, is the one measured.

`bench_async_noop`: bench_noop (tests/testapp) as an `async def` workflow, for the async
drain rows."""

from __future__ import annotations

import os
import sys
import time

from pydantic import BaseModel

import tasks_engine
from tasks_engine import AsyncTaskContext, TaskContext, workflow

if os.environ.get("BENCH_WORKER"):
    print(f"bench: tasks_engine from {tasks_engine.__file__}", file=sys.stderr, flush=True)


class PickupInput(BaseModel):
    k: int


def record_start(k: int) -> None:
    now = time.time()
    with open(os.environ["BENCH_LATENCY_FILE"], "a") as f:
        f.write(f"{k} {now:.6f}\n")


@workflow(name="bench_pickup", input=PickupInput)
def bench_pickup(ctx: TaskContext) -> None:
    k = ctx.input.k
    ctx.step.run("start", lambda: record_start(k))


@workflow(name="bench_async_noop")
async def bench_async_noop(ctx: AsyncTaskContext) -> None:
    """bench_noop's async twin (bench/run_all.py's async drain rows): one step, an `async def`
    that returns at once, awaited on the worker's event loop."""

    async def noop() -> None:
        return None

    await ctx.step.run("noop", noop)
