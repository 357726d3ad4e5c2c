"""SQLite connections of the engine's database, set up for several processes without the
project's `OPTIONS` (docs/SQLITE.md).

`startproject`'s `DATABASES` (`{"ENGINE": "django.db.backends.sqlite3", "NAME": ...}`) opens
deferred transactions, waits 5 s for a lock and keeps a rollback journal. With a worker beside
the web process, a deferred transaction that read and then writes after the other process
committed fails at once with "database is locked", and the step it interrupts runs again.

`safe_connection_settings` (a `connection_created` receiver) gives each new connection of the
engine's alias what the project's `OPTIONS` leave unset:

- `transaction_mode` IMMEDIATE: Django's SQLite backend reads the wrapper's `transaction_mode`
  at each `BEGIN`, so every transaction takes the write lock up front (waiting for it);
- a 30 s busy timeout (`timeout`);
- WAL (`journal_mode` in `init_command`): readers never wait for the writer;
- `synchronous=FULL` (in `init_command`): a commit survives a power loss.

A value the project set itself wins, whatever it is (`manage.py check` warns about a
`transaction_mode` other than IMMEDIATE: tasks_engine.W026).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from ..observe.logs import get_logger
from .alias import engine_alias

TRANSACTION_MODE = "IMMEDIATE"
BUSY_TIMEOUT_SECONDS = 30


def busy_timeout_seconds(db: dict[str, Any]) -> float:
    """How long an SQLite connection of `db` (a DATABASES entry) waits for the write lock: the
    project's `OPTIONS["timeout"]`, else the one `safe_connection_settings` gives it."""
    timeout = (db.get("OPTIONS") or {}).get("timeout")
    return float(BUSY_TIMEOUT_SECONDS if timeout is None else timeout)


def safe_connection_settings(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "sqlite" or connection.alias not in (DEFAULT_DB_ALIAS, engine_alias()):
        return
    options = connection.settings_dict.get("OPTIONS") or {}
    if options.get("transaction_mode") is None:
        # get_connection_params() set it from OPTIONS for this connection: None, a plain BEGIN
        connection.transaction_mode = TRANSACTION_MODE
    raw: sqlite3.Connection = connection.connection
    if options.get("timeout") is None:
        raw.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_SECONDS * 1000}")
    init_command = str(options.get("init_command") or "").lower()
    if "synchronous" not in init_command:
        raw.execute("PRAGMA synchronous = FULL")
    if "journal_mode" not in init_command:
        _use_wal(raw)


def _use_wal(raw: sqlite3.Connection) -> None:
    """WAL is a property of the database file: once set, every later connection has it. Only
    the switch can fail (another connection mid-transaction past the busy timeout): the
    connection then goes on in the journal mode it has, and the next one tries again."""
    try:
        raw.execute("PRAGMA journal_mode = WAL")
    except sqlite3.OperationalError as exc:
        get_logger().warning("sqlite: could not switch to WAL yet", error=str(exc))
