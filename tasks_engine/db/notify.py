"""Push wake-ups on PostgreSQL: NOTIFY inside the writer's transaction, LISTEN in workers.

NOTIFY is transactional, so a worker is woken only once the run it should claim is visible;
PostgreSQL folds identical notifications of one transaction into one, and the listener drains
every queued notification into a single wake-up. SQLite has no NOTIFY: workers poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..conf import engine_settings
from .alias import connection, engine_alias
from .pooler import behind_transaction_pooler

CHANNEL = "tasks_engine_wake"


def enabled() -> bool:
    return connection.vendor == "postgresql" and engine_settings().notify


def wake_workers(queue: str, *, cancel: bool = False) -> None:
    if not enabled():
        return
    with connection.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, %s)", [CHANNEL, ("cancel:" if cancel else "") + queue])


def listening_possible() -> bool:
    """LISTEN needs a session of its own: not through a transaction pooler, unless LISTEN_URL
    names a direct connection (tasks_engine/db/pooler.py). Otherwise workers and relays poll."""
    if connection.vendor != "postgresql":
        return False
    return bool(engine_settings().listen_url) or not behind_transaction_pooler()


def listen_params(alias: str | None = None) -> dict[str, Any]:
    """LISTEN_URL when set (for the engine's alias), else Django's connection parameters of
    `alias` (the engine's by default) minus the options only Django's wrapper understands."""
    url = engine_settings().listen_url
    if url and alias in (None, engine_alias()):
        return {"conninfo": url}
    params = dict(connections[alias or engine_alias()].get_connection_params())
    for key in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
        params.pop(key, None)
    return params


class Listener(threading.Thread):
    """Holds one dedicated connection in LISTEN on `channel` and calls `on_wake(payloads)` on
    each burst, and once after every (re)connect to cover what was sent while it was away.
    Used by the worker and by the outbox relay."""

    def __init__(
        self,
        on_wake: Callable[[list[str]], None],
        stop: threading.Event,
        log: Any,
        *,
        channel: str = CHANNEL,
        alias: str | None = None,
        name: str = "tasks-listener",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.on_wake = on_wake
        self.stop = stop
        self.log = log
        self.channel = channel
        self.alias = alias  # the database whose NOTIFYs it hears (None: the engine's)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # the thread ends: its owner's watch notices (loop.py)
            self.log.exception("listener crashed", error=str(exc))

    def _run(self) -> None:
        import psycopg

        outage = False
        while not self.stop.is_set():
            try:
                with psycopg.connect(**listen_params(self.alias), autocommit=True) as conn:
                    conn.execute(f"LISTEN {self.channel}")
                    self.log.info(
                        "listening for wake-ups", channel=self.channel, reconnected=outage
                    )
                    outage = False
                    self.on_wake(["reconnected"])
                    self._listen(conn)
            except psycopg.Error as exc:
                if not outage:
                    self.log.warning(
                        "listener lost its connection; polling meanwhile", error=str(exc).strip()
                    )
                    outage = True
                self.stop.wait(1.0)

    def _listen(self, conn: Any) -> None:
        while not self.stop.is_set():
            payloads = [n.payload for n in conn.notifies(timeout=1.0, stop_after=1)]
            if payloads:
                self.on_wake(payloads)  # the waiter's event folds bursts into one
