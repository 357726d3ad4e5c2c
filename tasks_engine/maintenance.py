"""Pruning finished runs (and, when the outbox is installed, dispatched events)."""

from __future__ import annotations

from datetime import timedelta

from django.apps import apps

from . import clock
from .models import WorkflowRun
from .states import FINISHED


def prune(older_than: timedelta) -> dict[str, int]:
    cutoff = clock.now() - older_than
    runs = WorkflowRun.objects.filter(status__in=list(FINISHED), finished_at__lt=cutoff)
    _, per_model = runs.delete()
    counts = {"runs": per_model.get("tasks_engine.WorkflowRun", 0)}
    if apps.is_installed("outbox"):
        from outbox.maintenance import prune_dispatched

        counts["outbox_events"] = prune_dispatched(cutoff)
    return counts
