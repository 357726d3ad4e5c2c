"""Facts and parking: consumed and re-checked under the run's row lock."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError

from .. import clock
from ..db.alias import atomic
from ..exceptions import LeaseLostError
from ..models import Fact, WorkflowRun
from ..states import FINISHED
from ._common import Lease, attempt_write, held_row
from .outcomes import cancel_active, park_run
from .steps import finish_step, flush_deferred

# -- waiting ----------------------------------------------------------------------------------


@attempt_write
def lock_held_run(lease: Lease) -> bool:
    """Lock the run row if this attempt still holds it. Inside a transaction."""
    return held_row(lease, lock=" FOR UPDATE") is not None


@attempt_write
def take_fact(lease: Lease, step_id: int, key: str, fact_name: str) -> tuple[bool, Any]:
    """Consume the oldest fact of that name no earlier wait took, and complete the wait step.

    Returns (found, payload). One transaction: the fact, the step and the fence move together.
    """
    flush_deferred(lease)
    with atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost while waiting for a fact")
        fact = (
            Fact.objects.filter(run_id=lease.run_id, name=fact_name, consumed_by="")
            .order_by("id")
            .values_list("id", "payload")
            .first()
        )
        if fact is None:
            return False, None
        Fact.objects.filter(pk=fact[0]).update(consumed_by=key)
        finish_step(lease, step_id, "completed", output=fact[1])
        return True, fact[1]


class Parking(enum.Enum):
    PARKED = "parked"  # the run is waiting now
    ARRIVED = "arrived"  # the awaited thing came meanwhile: go on without parking
    CANCELED = "canceled"  # cancel was requested: end the run instead


@attempt_write
def park_run_unless(
    lease: Lease,
    waiting_on: str,
    wake_at: datetime | None,
    deadline: datetime | None,
    arrived: Callable[[], bool],
    progress: dict[str, Any] | None = None,
) -> Parking:
    """Running -> waiting, unless `arrived()` says the awaited thing came meanwhile, or cancel
    was requested.

    Both are checked under the run's row lock: a fact, child result or cancel that committed
    after the handler decided to park is seen here, and one that commits later finds the run
    waiting (signal, child completion and cancel lock the same row), so none is lost.
    """
    flush_deferred(lease)
    with atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost before parking")
        if arrived():
            return Parking.ARRIVED
        if park_run(lease, waiting_on, wake_at, deadline, progress):
            return Parking.PARKED
        return Parking.CANCELED


@attempt_write
def fact_available(run_id: uuid.UUID, fact_name: str) -> bool:
    return Fact.objects.filter(run_id=run_id, name=fact_name, consumed_by="").exists()


@attempt_write
def child_outcome(child_id: uuid.UUID) -> tuple[str, Any, Any]:
    row = WorkflowRun.objects.filter(pk=child_id).values_list("status", "output", "error").get()
    return row[0], row[1], row[2]


@attempt_write
def time_out_child(lease: Lease, step_id: int, child_id: uuid.UUID, error: dict[str, Any]) -> bool:
    """`run_child`'s timeout passed: fail the wait step and cancel the child, in one
    transaction, unless the child finished meanwhile (then False, nothing written). The
    parent's row is locked before the child's (the lock order)."""
    flush_deferred(lease)
    with atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost before a child timed out")
        child = WorkflowRun.objects.select_for_update().filter(pk=child_id).first()
        if child is None or child.status in FINISHED:
            return False
        finish_step(lease, step_id, "failed", error=error)
        cancel_active(child, f"parent run {lease.run_id}: child timed out")
        return True


@attempt_write
def lock_for_child(lease: Lease) -> bool:
    """Before a run starts a child (inside that transaction): lock the run row if this attempt
    holds it and return whether cancel was requested. A cancel that commits first is seen here;
    one that commits later waits for this lock and then finds the child to cascade to."""
    row = held_row(lease, "cancel_requested_at", " FOR SHARE")
    if row is None:
        raise LeaseLostError(f"run {lease.run_id}: lease lost before starting a child")
    return row[0] is not None


def store_fact(
    run: WorkflowRun, name: str, payload: Any, idempotency_key: str | None, answered: str
) -> bool:
    """Add a fact (the caller holds the run's row lock). With a key already stored for this
    run: False and nothing written. The row lock serializes signals on PostgreSQL and SQLite's
    IMMEDIATE transactions do there; the savepoint makes a duplicate that still slips through
    a refusal, not an IntegrityError in the caller's transaction."""
    fact = Fact(
        run=run,
        name=name,
        payload=payload,
        idempotency_key=idempotency_key,
        answered_status=answered,
        created_at=clock.now(),
    )
    if idempotency_key is None:
        fact.save(force_insert=True)
        return True
    try:
        with atomic():
            fact.save(force_insert=True)
    except IntegrityError:
        return False
    return True
