"""factory-boy factories for the engine's and the outbox's rows: runs in every status (with
the fields each status needs to satisfy the table's constraints), step attempts, facts, op
ledger rows and outbox events. For tests that need rows in a given state without driving a
worker there (the admin, the browser and the statement tests).

    WorkflowRunFactory(status="running")             # leased, with a worker and a lease expiry
    StepAttemptFactory(run=run, name="copy", seconds=30, status="failed")
    OutboxEventFactory(status="dispatched")
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import factory
from factory.django import DjangoModelFactory

from outbox.models import OutboxEvent
from tasks_engine import clock
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun

FINISHED = ("completed", "failed", "canceled")


def _now(o: Any) -> datetime:
    return o.now or clock.now()


class WorkflowRunFactory(DjangoModelFactory):
    class Meta:
        model = WorkflowRun

    class Params:
        now = None  # the reference time of the other timestamps (default: the engine clock)

    task_name = "noop"
    status = "pending"
    input = factory.LazyFunction(lambda: {"n": 1})
    trace_id = factory.LazyFunction(lambda: uuid.uuid4().hex)
    created_at = factory.LazyAttribute(lambda o: _now(o) - timedelta(minutes=5))
    updated_at = factory.LazyAttribute(_now)
    started_at = factory.LazyAttribute(
        lambda o: None if o.status == "pending" else o.created_at + timedelta(seconds=2)
    )
    finished_at = factory.LazyAttribute(
        lambda o: o.created_at + timedelta(seconds=40) if o.status in FINISHED else None
    )
    attempts = factory.LazyAttribute(lambda o: 0 if o.status == "pending" else 1)
    available_at = factory.LazyAttribute(
        lambda o: (
            _now(o)
            if o.status == "pending"
            else _now(o) + timedelta(seconds=30)
            if o.status == "running"
            else None
        )
    )
    lease_token = factory.LazyAttribute(lambda o: uuid.uuid4() if o.status == "running" else None)
    worker_id = factory.LazyAttribute(lambda o: "worker-a1b2@host" if o.status == "running" else "")


class StepAttemptFactory(DjangoModelFactory):
    """`seconds`: how long it took (None: still running, no finished_at)."""

    class Meta:
        model = StepAttempt
        exclude = ("seconds",)

    run = factory.SubFactory(WorkflowRunFactory, status="running")
    name = factory.Sequence(lambda i: f"step-{i}")
    kind = "function"
    status = "completed"
    seconds: Any = 1.0
    started_at = factory.LazyAttribute(lambda o: o.run.created_at + timedelta(seconds=1))
    finished_at = factory.LazyAttribute(
        lambda o: None if o.seconds is None else o.started_at + timedelta(seconds=o.seconds)
    )


class FactFactory(DjangoModelFactory):
    class Meta:
        model = Fact

    run = factory.SubFactory(WorkflowRunFactory, status="waiting")
    name = "download-done"
    payload = factory.LazyFunction(lambda: {"ok": True})
    created_at = factory.LazyFunction(clock.now)


class OpLedgerFactory(DjangoModelFactory):
    class Meta:
        model = OpLedger

    op_key = factory.Sequence(lambda i: f"op:{i}")
    run = factory.SubFactory(WorkflowRunFactory, status="running")
    step_name = "submit-download"
    attempt_token = factory.LazyFunction(uuid.uuid4)
    status = "done"
    result = factory.LazyAttribute(lambda o: {"ok": True} if o.status == "done" else None)
    created_at = factory.LazyFunction(clock.now)
    updated_at = factory.LazyAttribute(lambda o: o.created_at)


class OutboxEventFactory(DjangoModelFactory):
    class Meta:
        model = OutboxEvent

    type = "test.record"
    payload = factory.LazyFunction(lambda: {"n": 1})
    status = "pending"
    attempts = factory.LazyAttribute(lambda o: 0 if o.status == "pending" else 1)
    created_at = factory.LazyFunction(clock.now)
    next_attempt_at = factory.LazyAttribute(lambda o: o.created_at)
    published_at = factory.LazyAttribute(
        lambda o: o.created_at + timedelta(seconds=1) if o.status == "dispatched" else None
    )
    last_error = factory.LazyAttribute(
        lambda o: "RuntimeError: route failed" if o.status == "dead" else ""
    )
