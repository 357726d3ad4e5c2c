"""Workflows for the flow-control tests (tests/engine/transitions/test_flow_control.py,
tests/process/test_flow.py). Each appends `start` and `end` records to a trace file (when given
one), from which the tests compute how many runs of a queue or key were running at once."""

from __future__ import annotations

import os
import time
from datetime import timedelta
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
    n: int = 0  # which enqueue this input was (debounce: the run starts with the last one's)


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
                n=inp.n,
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


# Debounce, on_limit and per-key rate limits (tests/engine/transitions/test_debounce.py,
# test_key_limits.py, tests/process/test_key_flow.py).
@workflow(
    name="flow-debounce",
    input=Job,
    debounce=timedelta(seconds=0.3),
    debounce_key=lambda inp: f"d:{inp.disk}",
)
def flow_debounce(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(
    name="flow-debounce-max",
    input=Job,
    debounce=timedelta(seconds=10),
    debounce_key=lambda inp: f"d:{inp.disk}",
    debounce_max=timedelta(seconds=25),
)
def flow_debounce_max(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(
    name="flow-cancel-new",
    input=Job,
    concurrency_key=lambda inp: f"new:{inp.disk}",
    on_limit="cancel_new",
)
def flow_cancel_new(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(
    name="flow-cancel-running",
    input=Job,
    concurrency_key=lambda inp: f"old:{inp.disk}",
    concurrency_limit=2,
    on_limit="cancel_running",
)
def flow_cancel_running(ctx: TaskContext) -> dict:
    return _work(ctx)


@workflow(name="flow-key-rate", input=Job, rate_limit="2/s", rate_limit_key=lambda inp: inp.disk)
def flow_key_rate(ctx: TaskContext) -> dict:
    return _work(ctx)
