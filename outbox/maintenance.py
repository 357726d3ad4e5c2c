"""Pruning of dispatched events (filled in with the outbox model)."""

from __future__ import annotations

from datetime import datetime


def prune_dispatched(cutoff: datetime) -> int:
    from django.apps import apps

    try:
        model = apps.get_model("outbox", "OutboxEvent")
    except LookupError:
        return 0
    deleted, _ = model.objects.filter(status="dispatched", published_at__lt=cutoff).delete()
    return deleted
