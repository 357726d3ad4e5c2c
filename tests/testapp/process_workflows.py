"""Workflows for the real-process tests of leases and database outages (tests/process/,
tests/faults/). Their step bodies record what they did in files (the path comes with the input),
so that the record survives whatever happens to the database."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tasks_engine import RetryPolicy, TaskContext, workflow

from .models import SideEffect


def trace_lines(path: str | Path) -> list[dict[str, Any]]:
    """The records a traced workflow appended to `path` (one JSON object per line)."""
    p = Path(path)
    if not p.exists():
        return []
    # Only whole lines: the last one may still be being written by another process.
    return [json.loads(line) for line in p.read_text().split("\n")[:-1] if line.strip()]


def _append(path: str | Path, **record: Any) -> None:
    with open(path, "a") as f:  # one short write per record: appends do not interleave
        f.write(json.dumps({**record, "at": time.time()}) + "\n")


class OutageMix(BaseModel):
    trace_dir: str
    steps: int = 3
    step_seconds: float = 0.6
    sleep_seconds: float = 0.4
    fact: bool = True
    db: bool = False  # the bodies also write a row once they are done (user code's own query)


@workflow(name="outage_mix", input=OutageMix)  # the default step retry: 3 attempts
def outage_mix(ctx: TaskContext) -> dict:
    """Steps that take a while, durable sleeps between them, then a fact wait and a last step:
    a run spends its time running a step, between steps, sleeping and waiting. Each body returns
    how many times it had started by then (its own start included), so a test can tell that the
    body whose result was checkpointed is the last one that ever started."""
    trace = Path(ctx.input.trace_dir) / f"{ctx.run_id}.jsonl"

    def body(step: str) -> dict:
        started = 1 + sum(
            1 for r in trace_lines(trace) if r["step"] == step and r["event"] == "start"
        )
        _append(trace, step=step, event="start")
        time.sleep(ctx.input.step_seconds)  # meanwhile the worker's connections may be cut
        if ctx.input.db:
            SideEffect.objects.create(key=f"{step}:end", run_id=ctx.run_id)
        _append(trace, step=step, event="end")
        return {"step": step, "start": started}

    outputs = []
    for i in range(ctx.input.steps):
        outputs.append(ctx.step.run(f"work-{i}", partial(body, f"work-{i}")))
        ctx.step.sleep(f"nap-{i}", ctx.input.sleep_seconds)
    fact = ctx.step.wait_for_fact("go") if ctx.input.fact else None
    outputs.append(ctx.step.run("last", partial(body, "last")))
    return {"fact": fact, "starts": [o["start"] for o in outputs]}


class OutageStep(BaseModel):
    trace: str
    seconds: float = 1.5


@workflow(name="outage_step", input=OutageStep)  # the default step retry: 3 attempts
def outage_step(ctx: TaskContext) -> dict:
    """One step that takes a while and touches no database (its starts go to `trace`)."""

    def body() -> dict:
        _append(ctx.input.trace, step="work", event="start")
        time.sleep(ctx.input.seconds)
        _append(ctx.input.trace, step="work", event="end")
        return {"starts": sum(1 for r in trace_lines(ctx.input.trace) if r["event"] == "start")}

    return ctx.step.run("work", body)


class LeaseWatch(BaseModel):
    trace: str
    seconds: float = 60.0


@workflow(name="lease_watch", input=LeaseWatch)
def lease_watch(ctx: TaskContext) -> dict:
    """One step that waits on its abort signal for up to `seconds` and records when and why it
    was aborted. Once an earlier attempt was aborted, the next attempt finishes at once."""

    def watch() -> dict:
        earlier = [r for r in trace_lines(ctx.input.trace) if r["event"] == "aborted"]
        _append(ctx.input.trace, event="start", attempt=ctx.attempt)
        if earlier:
            _append(ctx.input.trace, event="finished", attempt=ctx.attempt)
            return {"aborted_before": len(earlier)}
        end = time.monotonic() + ctx.input.seconds
        while time.monotonic() < end:
            if ctx.abort_signal.wait(0.1):
                reason = ctx.abort_signal.reason
                _append(
                    ctx.input.trace,
                    event="aborted",
                    attempt=ctx.attempt,
                    reason=type(reason).__name__,
                    message=str(reason),
                )
                assert reason is not None
                raise reason
        _append(ctx.input.trace, event="never-aborted", attempt=ctx.attempt)
        return {"aborted_before": 0}

    return ctx.step.run("watch", watch)


class LongAtomic(BaseModel):
    trace: str
    seconds: float
    key: str = "long-atomic"


@workflow(name="long_atomic", input=LongAtomic, step_retry=RetryPolicy(max_attempts=1))
def long_atomic(ctx: TaskContext) -> str:
    """One atomic step that writes a row, then keeps its transaction open for `seconds`
    (longer than the lease in the tests). Each start of its body goes to `trace`."""

    def body() -> str:
        _append(ctx.input.trace, step="hold", event="start", attempt=ctx.attempt)
        SideEffect.objects.create(key=ctx.input.key, run_id=ctx.run_id)
        time.sleep(ctx.input.seconds)
        _append(ctx.input.trace, step="hold", event="end", attempt=ctx.attempt)
        return "committed"

    return ctx.step.run("hold", body, atomic=True)


@workflow(name="fenced_in_atomic", input=LongAtomic, step_retry=RetryPolicy(max_attempts=1))
def fenced_in_atomic(ctx: TaskContext) -> str:
    """An atomic step whose body makes a fenced commit (which locks the run's row until the
    step's transaction commits), then keeps that transaction open for `seconds`."""

    def body() -> str:
        _append(ctx.input.trace, step="hold", event="start", attempt=ctx.attempt)
        ctx.with_attempt_token(f"{ctx.input.key}:{ctx.run_id}", lambda info: "done")
        time.sleep(ctx.input.seconds)
        return "committed"

    return ctx.step.run("hold", body, atomic=True)


class Ticks(BaseModel):
    steps: int = 20
    seconds: float = 0.02


@workflow(name="ticker", input=Ticks)
def ticker(ctx: TaskContext) -> int:
    """`steps` steps of `seconds` each (the bulk cancel's race, tests/process/test_bulk.py)."""
    for i in range(ctx.input.steps):
        ctx.step.run("tick", partial(_tick, ctx.input.seconds, i))
    return ctx.input.steps


def _tick(seconds: float, i: int) -> int:
    time.sleep(seconds)
    return i
