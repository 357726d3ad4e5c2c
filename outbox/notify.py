"""Wake-ups for the relay on PostgreSQL: NOTIFY in the publisher's transaction, LISTEN in the relay.

NOTIFY is transactional: the relay is woken only once the event it should dispatch is committed
(and never for a rolled-back one). Identical notifications of one transaction are folded into
one, so a burst of publishes costs one wake-up. SQLite has no NOTIFY: the relay polls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

CHANNEL = "outbox_wake"


def wake_relay() -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, '')", [CHANNEL])


def _listen_params() -> dict[str, Any]:
    """Django's connection parameters, minus the options only Django's wrapper understands."""
    params = dict(connections["default"].get_connection_params())
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    return params


class RelayListener(threading.Thread):
    """One dedicated autocommit connection in LISTEN; calls `on_wake()` on each notification
    burst, and once after every (re)connect to cover anything published while it was away."""

    def __init__(self, on_wake: Callable[[], None], stop: threading.Event, log: Any) -> None:
        super().__init__(name="outbox-listener", daemon=True)
        self.on_wake = on_wake
        self.stop = stop
        self.log = log

    def run(self) -> None:
        import psycopg

        down = False
        while not self.stop.is_set():
            try:
                with psycopg.connect(**_listen_params(), autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.log.info("relay listening", channel=CHANNEL, reconnected=down)
                    down = False
                    self.on_wake()
                    while not self.stop.is_set():
                        if any(True for _ in conn.notifies(timeout=1.0, stop_after=1)):
                            self.on_wake()
            except psycopg.Error as exc:
                if not down:
                    self.log.warning(
                        "listener lost its connection; polling meanwhile", error=str(exc).strip()
                    )
                    down = True
                self.stop.wait(1.0)
