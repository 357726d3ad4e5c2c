"""PostgreSQL: keep an atomic step's transaction alive while its code runs.

A worker's sessions set `idle_in_transaction_session_timeout` (twice the lease, 10 s at least:
worker/loop.py), so that a frozen worker cannot hold row locks for long. An `atomic=True` step
keeps its transaction open, idle between its statements, for as long as its code runs: one
that ran past that bound had its session ended by the server, its commit failed as an outage,
and the same worker reclaimed the run without counting the attempt, so the step started over
for ever. The heartbeat renews the lease meanwhile (its own connection, no row lock in the
way): the transaction was all that lapsed.

`kept_alive` sends `SELECT 1` on the step's connection every second while the transaction sits
idle, from a thread of the worker: a frozen worker sends nothing, and the server's bound still
ends its transaction. So does a step that was aborted (cancel, timeout, deadline, lost lease)
and goes on regardless: once the abort signal is set, nothing is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

from ..db.alias import engine_alias

KEEPALIVE_SECONDS = 1.0  # far below the 10 s floor of the worker's idle bound


@contextmanager
def kept_alive(aborted: Callable[[], bool], using: str | None = None) -> Iterator[None]:
    """Inside the step's `transaction.atomic()`: keep it from being ended as idle until the
    block exits or `aborted()` is true (the run's abort signal). Nothing on SQLite, where
    db/sqlite_bounds.py bounds the transaction instead."""
    conn = connections[using or engine_alias()]
    if conn.vendor != "postgresql" or conn.connection is None:
        yield
        return
    keeper = _Keeper(conn.connection, aborted)
    keeper.start()
    try:
        yield
    finally:
        keeper.stop()  # before the commit: no ping may begin a transaction after it


class _Keeper(threading.Thread):
    def __init__(self, raw: Any, aborted: Callable[[], bool]) -> None:
        super().__init__(name="tasks-atomic-keepalive", daemon=True)
        self._raw = raw
        self._aborted = aborted
        self._lock = threading.Lock()  # a ping and stop() never overlap
        self._stopped = False
        self._wake = threading.Event()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._wake.set()

    def run(self) -> None:
        while not self._wake.wait(KEEPALIVE_SECONDS):
            if self._aborted() or not self._ping():
                return

    def _ping(self) -> bool:
        """Reset the session's idle timer if the transaction is idle (psycopg serialises this
        with the step's own statements). False once there is nothing more to do."""
        from psycopg import Error, pq

        with self._lock:
            if self._stopped:
                return False
            if self._raw.info.transaction_status != pq.TransactionStatus.INTRANS:
                return True  # a statement is running (not idle), or none has begun one
            try:
                self._raw.execute("SELECT 1", prepare=False)
            except Error:
                return False  # the transaction failed or the connection is gone
        return True
