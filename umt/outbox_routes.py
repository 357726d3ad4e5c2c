"""Outbox routes of UMT: a planned acquisition starts its `acquire` run."""

from __future__ import annotations

from outbox import OutboxEvent, route

from .acquisition import PLANNED
from .models import AcquisitionPlan
from .workflows import acquire


@route(PLANNED)
def start_acquire(event: OutboxEvent) -> None:
    """Enqueue the plan's run and note its id on the plan, in the relay's transaction."""
    plan_id = int(event.payload["plan_id"])
    run = acquire.enqueue({"plan_id": plan_id}, idempotency_key=f"plan:{plan_id}")
    AcquisitionPlan.objects.filter(pk=plan_id, run_id__isnull=True).update(run_id=run.run_id)
