"""`async def` workflows: in-process tests (tests/engine/runtime/test_async_workflows.py) and
real worker processes (tests/process/test_async.py). Step bodies that must survive a killed
worker record what they did in files (`trace`), as process_workflows.py's do."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tasks_engine import AsyncTaskContext, OpInfo, RetryPolicy, workflow

from .models import Marker, SideEffect
from .process_workflows import _append


class Basic(BaseModel):
    trace: str = ""
    pause: float = 0.0  # seconds the async step awaits
    sleep: float = 0.0  # the durable sleep


def _trace(ctx: AsyncTaskContext, **record: Any) -> None:
    if ctx.input.trace:
        _append(Path(ctx.input.trace) / f"{ctx.run_id}.jsonl", **record)


@workflow(name="async_basic", input=Basic)
async def async_basic(ctx: AsyncTaskContext) -> dict:
    """An async step on the loop, a plain one in a thread, a lambda returning a coroutine, and
    a durable sleep between them."""

    async def lookup() -> dict:
        _trace(ctx, step="lookup", event="start")
        await asyncio.sleep(ctx.input.pause)
        _trace(ctx, step="lookup", event="end")
        return {"loop": threading.current_thread().name, "pid": os.getpid()}

    def plain() -> dict:
        _trace(ctx, step="plain", event="start")
        SideEffect.objects.create(key="async_basic:plain", run_id=ctx.run_id)
        return {"thread": threading.current_thread().name}

    async def doubled(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    looked = await ctx.step.run("lookup", lookup)
    done = await ctx.step.run("plain", plain)
    await ctx.step.sleep("cool-down", ctx.input.sleep)
    twice = await ctx.step.run("lambda", lambda: doubled(21))
    return {"lookup": looked, "plain": done, "twice": twice}


class Full(BaseModel):
    sleep: float = 0.0
    fact_timeout: float | None = None


@workflow(name="async_child", input=Basic)
async def async_child(ctx: AsyncTaskContext) -> dict:
    async def inside() -> dict:
        await asyncio.sleep(0)
        return {"child": True}

    return await ctx.step.run("inside", inside)


@workflow(name="async_full", input=Full)
async def async_full(ctx: AsyncTaskContext) -> dict:
    """Every kind of step an async workflow awaits: sleep, fact wait, child, atomic, fenced
    side effect, patched."""
    key = str(ctx.run_id)
    await ctx.step.sleep("nap", ctx.input.sleep)
    fact = await ctx.step.wait_for_fact("approved", timeout=ctx.input.fact_timeout)
    child = await ctx.step.run_child("async_child", {}, name="child")

    def atomic_write() -> str:
        Marker.objects.create(key=f"atomic:{key}")
        return "written"

    atomic = await ctx.step.run("atomic", atomic_write, atomic=True)

    async def outside(info: OpInfo) -> dict:
        await asyncio.sleep(0)
        return {"resumed": info.resumed}

    op = await ctx.with_attempt_token(
        f"op:{key}",
        outside,
        commit=lambda result: Marker.objects.create(key=f"op:{key}", value=str(result)),
    )
    new_path = await ctx.patched("v2")
    return {"fact": fact, "child": child, "atomic": atomic, "op": op, "patched": new_path}


class Blocker(BaseModel):
    trace: str
    seconds: float = 60.0
    timeout: float | None = None
    max_attempts: int = 1
    then: bool = False  # a second step after the blocking one
    ignores: bool = False  # the step swallows its cancellation and keeps awaiting


@workflow(name="async_blocker", input=Blocker)
async def async_blocker(ctx: AsyncTaskContext) -> dict:
    """A step that awaits for a long time and records whether it was cancelled (and why, from
    the abort signal), for cancel, timeout, deadline and lost-lease tests."""

    async def block() -> dict:
        _trace(ctx, step="block", event="start", attempt=ctx.attempt)
        try:
            await asyncio.sleep(ctx.input.seconds)
        except asyncio.CancelledError:
            reason = ctx.abort_signal.reason
            _trace(ctx, step="block", event="cancelled", reason=type(reason).__name__)
            if not ctx.input.ignores:
                raise
            await asyncio.sleep(ctx.input.seconds)  # a step that ignores its abort
            _trace(ctx, step="block", event="ignored")
        _trace(ctx, step="block", event="end")
        return {"blocked": ctx.input.seconds}

    retry = RetryPolicy(max_attempts=ctx.input.max_attempts, initial_interval=0.1)
    out = await ctx.step.run("block", block, timeout=ctx.input.timeout, retry=retry)
    if ctx.input.then:
        await ctx.step.run("then", lambda: {"then": True})
    return out


class Killable(BaseModel):
    trace: str
    seconds: float = 2.0


@workflow(name="async_killable", input=Killable)
async def async_killable(ctx: AsyncTaskContext) -> dict:
    """Two steps: the first quick, the second slow (a worker is killed inside it): the first
    must not run again on replay."""

    async def quick() -> int:
        _trace(ctx, step="quick", event="start")
        return 1

    async def slow() -> int:
        _trace(ctx, step="slow", event="start")
        await asyncio.sleep(ctx.input.seconds)
        _trace(ctx, step="slow", event="end")
        return 2

    return {"quick": await ctx.step.run("quick", quick), "slow": await ctx.step.run("slow", slow)}


class Io(BaseModel):
    seconds: float = 1.0


@workflow(name="async_io", input=Io, queue="async-io")
async def async_io(ctx: AsyncTaskContext) -> dict:
    """One step awaiting I/O (a sleep stands for it): a thousand at once hold no thousand
    threads."""

    async def io() -> float:
        started = time.time()
        await asyncio.sleep(ctx.input.seconds)
        return started

    return {"started": await ctx.step.run("io", io), "threads": threading.active_count()}


@workflow(name="async_checked")
async def async_checked(ctx: AsyncTaskContext) -> bool:
    """A fact wait whose `check` is an async def that reads a business table (async ORM)."""

    async def ready() -> bool | None:
        return await Marker.objects.filter(key=f"ready:{ctx.run_id}").aexists() or None

    return bool(await ctx.step.wait_for_fact("ready", check=ready, check_interval=5))
