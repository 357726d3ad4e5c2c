"""Wake-ups for the relay on PostgreSQL: NOTIFY in the publisher's transaction, LISTEN in the relay.

NOTIFY is transactional: the relay is woken only once the event it should dispatch is committed
(and never for a rolled-back one). Identical notifications of one transaction are folded into
one, so a burst of publishes costs one wake-up. SQLite has no NOTIFY: the relay polls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections, router

from tasks_engine.db.notify import Listener

CHANNEL = "outbox_wake"


def outbox_alias() -> str:
    """The database of the outbox's table (the business data's: "default" unless a router
    says otherwise), which may not be the engine's (TASKS_ENGINE["DATABASE"])."""
    from .models import OutboxEvent

    return router.db_for_write(OutboxEvent)


def wake_relay() -> None:
    connection = connections[outbox_alias()]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, '')", [CHANNEL])


def relay_listener(on_wake: Callable[[], None], stop: threading.Event, log: Any) -> Listener:
    """The engine's LISTEN thread on the relay's channel."""
    return Listener(
        lambda _payloads: on_wake(),
        stop,
        log,
        channel=CHANNEL,
        name="outbox-listener",
        alias=outbox_alias(),
    )
