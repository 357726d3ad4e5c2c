"""Workflows for the flow-control tests (tests/engine/transitions/test_flow_control.py,
tests/process/test_flow.py). Each appends `start` and `end` records to a trace file (when given
one), from which the tests compute how many runs of a queue or key were running at once."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel

from tasks_engine import NonRetryableError, TaskContext, workflow

from .process_workflows import _append


class Job(BaseModel):
    disk: str = "a"
    seconds: float = 0.0
    trace: str = ""
    sleep: float = 0.0  # a durable sleep first (the run waits, holding no place)
    touch: str = ""  # a file the step creates when it starts
    await_path: str = ""  # a file the step waits for (another run's `touch`) before it ends


def _work(ctx: TaskContext) -> dict:
    inp = ctx.input
    if inp.sleep:
        ctx.step.sleep("rest", inp.sleep)

    def mark(event: str) -> None:
        if inp.trace:
            _append(
                inp.trace,
                event=event,
                run=str(ctx.run_id),
                key=inp.disk,
                q=ctx.queue,
                pid=os.getpid(),
            )

    def body() -> str:
        mark("start")
        if inp.touch:
            Path(inp.touch).touch()
        if inp.await_path:  # runs side by side, or this one never ends
            deadline = time.monotonic() + 60
            while not Path(inp.await_path).exists():
                if time.monotonic() > deadline:
                    raise NonRetryableError(f"{inp.await_path} never appeared")
                time.sleep(0.05)
        time.sleep(inp.seconds)
        mark("end")
        return inp.disk

    return {"disk": ctx.step.run("work", body)}


@workflow(name="flow-disk", input=Job, concurrency_key=lambda inp: f"disk:{inp.disk}")
def flow_disk(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(name="flow-pair", input=Job, concurrency_key="pair", concurrency_limit=2)
def flow_pair(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(name="flow-plain", input=Job, queue="flow-io")
def flow_plain(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(name="flow-rated", input=Job, queue="flow-rate")
def flow_rated(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(name="flow-scan", input=Job, queueing_key=lambda inp: f"scan:{inp.disk}")
def flow_scan(ctx: TaskContext) -> dict:
    return _work(ctx)
