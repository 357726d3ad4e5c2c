"""Facts and parking: consumed and re-checked under the run's row lock."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction

from ..exceptions import LeaseLostError
from ..models import Fact, WorkflowRun
from ..sql import (
    fetchall,
    is_postgres,
)
from ._common import RUN, Lease, _fence_params
from .outcomes import park_run
from .steps import finish_step, flush_deferred

# -- waiting ----------------------------------------------------------------------------------


def lock_held_run(lease: Lease) -> bool:
    """Lock the run row if this attempt still holds it. Inside a transaction."""
    rows = fetchall(
        f"SELECT 1 FROM {RUN} WHERE id = %s AND lease_token = %s"
        + (" FOR UPDATE" if is_postgres() else ""),
        _fence_params(lease),
    )
    return bool(rows)


def take_fact(lease: Lease, step_id: int, key: str, fact_name: str) -> tuple[bool, Any]:
    """Consume the oldest fact of that name no earlier wait took, and complete the wait step.

    Returns (found, payload). One transaction: the fact, the step and the fence move together.
    """
    flush_deferred(lease)
    with transaction.atomic():
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


def park_run_unless(
    lease: Lease,
    waiting_on: str,
    wake_at: datetime | None,
    deadline: datetime | None,
    arrived: Callable[[], bool],
) -> bool:
    """Running -> waiting, unless `arrived()` says the awaited thing came meanwhile.

    `arrived` runs under the run's row lock: a fact or child result that committed after the
    handler decided to park is seen here, and one that commits later finds the run waiting
    (signal and child completion lock the same row), so no wake-up is lost.
    """
    flush_deferred(lease)
    with transaction.atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost before parking")
        if arrived():
            return False
        park_run(lease, waiting_on, wake_at, deadline)
        return True


def fact_available(run_id: uuid.UUID, fact_name: str) -> bool:
    return Fact.objects.filter(run_id=run_id, name=fact_name, consumed_by="").exists()


def child_outcome(child_id: uuid.UUID) -> tuple[str, Any, Any]:
    row = WorkflowRun.objects.filter(pk=child_id).values_list("status", "output", "error").get()
    return row[0], row[1], row[2]
