"""Database outages in long-running loops (worker threads, the outbox relay): close the
thread's connection, log once per outage, back off. A misconfiguration that no back-off cures
(prepared statements through a transaction pooler the settings do not declare) is logged as
such, once per thread, and flagged in `misconfigured`: the worker stops on it."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from typing import Any

import psycopg
from django.db import Error as DjangoDbError

from ..exceptions import EngineUnavailable
from .alias import connection
from .pooler import explained, lost_prepared_statement

DB_ERRORS: tuple[type[BaseException], ...] = (DjangoDbError, EngineUnavailable)
misconfigured = threading.Event()  # a thread met a lost prepared statement (see `failed`)
MAX_BACKOFF_SECONDS = 5.0


class Outage:
    """Per-thread outage state so a down database is logged once, not in a tight loop."""

    def __init__(self, log: Any, what: str) -> None:
        self.log = log
        self.what = what
        self.down = False
        self.backoff = 0.5

    def failed(self, exc: BaseException) -> float:
        with contextlib.suppress(Exception):  # the connection is already broken
            connection.close()
        if lost_prepared_statement(exc):
            if not misconfigured.is_set():  # once per process: each thread would meet it
                misconfigured.set()
                self.log.error(
                    "database misconfigured for a transaction pooler",
                    where=self.what,
                    error=str(explained(exc)).strip(),
                )
        elif not self.down:
            self.log.warning("database unavailable", where=self.what, error=str(exc).strip())
            self.down = True
        delay = self.backoff
        self.backoff = min(self.backoff * 2, MAX_BACKOFF_SECONDS)
        return delay

    def ok(self) -> None:
        if self.down:
            self.log.info("database reachable again", where=self.what)
        self.down = False
        self.backoff = 0.5


CUT_CHECK_SECONDS = 0.1  # a thread busier than this meets a cut on its next statement anyway
_last_check = threading.local()


def drop_if_cut() -> bool:
    """Close this thread's connection if the server ended the session while it sat idle (a
    restart, a failover, a pooler, `pg_terminate_backend`): the server's farewell, or the end
    of the stream, is then waiting on the socket. The next statement connects afresh instead
    of failing on the dead session and costing its run a back-off and a hand-back. One poll,
    no round trip, and at most every CUT_CHECK_SECONDS per thread (under load a run's check
    cost more than the rest of its Python). PostgreSQL only; never inside a transaction."""
    now = time.monotonic()
    if now - getattr(_last_check, "at", 0.0) < CUT_CHECK_SECONDS:
        return False
    _last_check.at = now
    raw = connection.connection
    if raw is None or connection.vendor != "postgresql" or connection.in_atomic_block:
        return False
    try:
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        cut = bool(poller.poll(0)) or raw.closed
    except (OSError, ValueError, DjangoDbError, psycopg.Error):  # psycopg's: a lost socket
        cut = True
    if cut:
        with contextlib.suppress(Exception):
            connection.close()
    return cut
