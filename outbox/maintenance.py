"""Pruning of dispatched events (`manage.py tasks prune`). Pending and dead events are kept.

In batches, each its own short transaction, like the runs (tasks_engine/maintenance.py)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

PRUNE_BATCH = 500


def prune_dispatched(
    cutoff: datetime, *, batch: int = PRUNE_BATCH, max_batches: int | None = None
) -> int:
    """Delete events dispatched before `cutoff`, `batch` per transaction, at most
    `max_batches` transactions (None: until none is left); return how many."""
    from .models import EventStatus, OutboxEvent

    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        batches += 1
        with transaction.atomic():
            ids = list(
                OutboxEvent.objects.filter(status=EventStatus.DISPATCHED, published_at__lt=cutoff)
                .order_by("published_at")
                .values_list("pk", flat=True)[:batch]
            )
            if ids:
                deleted, _ = OutboxEvent.objects.filter(pk__in=ids).delete()
                total += deleted
        if len(ids) < batch:
            break
    return total
