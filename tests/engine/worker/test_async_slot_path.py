"""The async slot path's trips off the event loop: a fresh async run whose claim started its
first step, and whose completion a group writer takes, makes none (worker/async_runs.py,
runtime/async_steps.py `_opens_in_memory`, executor.py `_completes_in_memory`). SQLite's claim
starts no first step: the step's start is one trip there, the completion none."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
from django.db import connection

import tasks_engine
from tasks_engine import transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.runtime.bridge import PoolBridge
from tasks_engine.transitions import first_steps
from tasks_engine.worker.group_commit import GroupCommit
from tasks_engine.worker.slots import Held, SlotPool

pytestmark = pytest.mark.django_db(transaction=True)  # the group writer's own connection

PAIRS = [("async_io", 1)]


class CountingBridge(PoolBridge):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop, 1, 1)
        self.calls: list[str] = []

    def engine(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(getattr(fn, "__name__", repr(fn)))
        return super().engine(fn, *args, **kwargs)


class Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_a_fresh_async_run_with_a_prestarted_first_step_makes_no_trip_off_the_loop() -> None:
    sqlite = connection.vendor == "sqlite"
    if sqlite and connection.is_in_memory_db():  # type: ignore[attr-defined]
        pytest.skip("the group writer's thread needs a database file")
    first_steps.learn("async_io", 1, "io")  # its claim starts step "io" (PostgreSQL)
    rid = tasks_engine.enqueue("async_io", {"seconds": 0}).run_id
    [c] = transitions.claim_runs("w", PAIRS, None, 1, 30.0)
    assert (c.prestarted is None) if sqlite else (c.prestarted and c.prestarted[0] == "io")
    slots = SlotPool(1, 0)
    claims = transitions.ClaimRequest("w", PAIRS, None, 0, 30.0)
    group = GroupCommit(slots, claims, Log(), sqlite=sqlite)
    group.start()
    loop = asyncio.new_event_loop()
    bridge = CountingBridge(loop)
    try:
        lease = dataclasses.replace(c.lease, writer=group)
        prepared = executor.prepare(c.run, lease, threading.Event(), c.prestarted)
        slots.hold(Held(lease, prepared.ctx, prepared.handle, renewed_at=0.0))
        outcome = loop.run_until_complete(
            executor.aexecute(c.run, prepared.workflow, prepared.ctx, bridge)
        )
    finally:
        group.stop()
        group.join(10)
        bridge.shutdown()
        loop.close()
    assert outcome == "completed"
    # Before: _open (the step's start, already made by the claim) and _after_return.
    assert bridge.calls == (["_open"] if sqlite else [])
    run = WorkflowRun.objects.get(pk=rid)
    assert run.status == "completed" and run.output["started"] > 0
    assert list(StepAttempt.objects.filter(run_id=rid).values_list("name", "status")) == [
        ("io", "completed")
    ]
