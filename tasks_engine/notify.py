"""Push wake-ups on PostgreSQL: NOTIFY inside the writer's transaction, LISTEN in workers.

NOTIFY is transactional, so a worker is woken only once the run it should claim is visible;
PostgreSQL folds identical notifications of one transaction into one, and the listener drains
every queued notification into a single wake-up. SQLite has no NOTIFY: workers poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

from .conf import engine_settings

CHANNEL = "tasks_engine_wake"


def enabled() -> bool:
    return connection.vendor == "postgresql" and engine_settings().notify


def wake_workers(queue: str, *, cancel: bool = False) -> None:
    if not enabled():
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, ("cancel:" if cancel else "") + queue])


class Listener(threading.Thread):
    """Holds one dedicated connection in LISTEN and calls `on_wake(payloads)` on each burst."""

    def __init__(self, on_wake: Callable[[list[str]], None], stop: threading.Event, log: Any):
        super().__init__(name="tasks-listener", daemon=True)
        self.on_wake = on_wake
        self.stop = stop
        self.log = log
        self.failed = False

    def run(self) -> None:
        import psycopg

        outage = False
        while not self.stop.is_set():
            try:
                params = connections["default"].get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                params.pop("server_side_binding", None)
                params.pop("prepare_threshold", None)
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.log.info("listening for wake-ups", reconnected=outage)
                    outage = False
                    self.on_wake(["reconnected"])
                    self._listen(conn)
            except psycopg.Error as exc:
                if not outage:
                    self.log.warning(
                        "listener lost its connection; polling meanwhile", error=str(exc)
                    )
                    outage = True
                self.stop.wait(1.0)

    def _listen(self, conn: Any) -> None:
        while not self.stop.is_set():
            payloads = [n.payload for n in conn.notifies(timeout=1.0, stop_after=1)]
            if payloads:
                self.on_wake(payloads)  # the worker's wake event folds bursts into one
