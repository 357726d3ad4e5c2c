"""Pruning of dispatched events (`manage.py tasks prune`). Pending and dead events are kept."""

from __future__ import annotations

from datetime import datetime


def prune_dispatched(cutoff: datetime) -> int:
    """Delete events dispatched before `cutoff`; return how many were deleted."""
    from .models import EventStatus, OutboxEvent

    deleted, _ = OutboxEvent.objects.filter(
        status=EventStatus.DISPATCHED, published_at__lt=cutoff
    ).delete()
    return deleted
