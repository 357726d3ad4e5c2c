"""Transactional outbox: publish events with your writes, dispatch them exactly once.

Import-safe before apps load: anything that touches models is imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .routes import route

__all__ = ["OutboxEvent", "publish", "retry_dead", "route"]

if TYPE_CHECKING:
    from .events import publish, retry_dead
    from .models import OutboxEvent


def __getattr__(name: str) -> Any:
    if name in ("publish", "retry_dead"):
        from . import events

        return getattr(events, name)
    if name == "OutboxEvent":
        from .models import OutboxEvent

        return OutboxEvent
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")
