"""Behind a transaction pooler (PgBouncer in transaction mode): each transaction may run on a
different server connection, so nothing the engine does may rely on a session.

Django's own signal for it is `DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True`
(the setting Django documents for transaction pooling); the engine reads the same one. Then:

- the worker does not `SET idle_in_transaction_session_timeout` on its sessions (the SET would
  land on one server connection and stay there for other clients): set PgBouncer's
  `idle_transaction_timeout`, or `ALTER ROLE ... SET idle_in_transaction_session_timeout`;
- LISTEN, which needs a session, goes to `TASKS_ENGINE["LISTEN_URL"]` (a direct connection to
  PostgreSQL) when it is set; without it workers and relays poll (`POLL_INTERVAL`);
- `PREPARED_STATEMENTS` must be False (PgBouncer before 1.21 keeps no prepared statements);
  `manage.py check` says so (tasks_engine.E020).
NOTIFY itself is sent inside the writer's transaction and works through the pooler.

A pooler the settings do not declare is seen twice: before a worker starts (and by `manage.py
check --database default`, tasks_engine.E027), two connections that reach one server session;
at run time, a prepared statement another client left on the server connection, or one this
client prepared on another (TransactionPoolerError, not a database outage)."""

from __future__ import annotations

import contextlib
from typing import Any

from django.conf import settings
from django.db import Error as DjangoDbError
from django.db import connections

from ..exceptions import TransactionPoolerError
from .alias import engine_alias

SETTINGS_TO_CHANGE = (
    "set DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] = True and "
    "TASKS_ENGINE['PREPARED_STATEMENTS'] = False, and leave "
    "DATABASES['default']['OPTIONS']['prepare_threshold'] unset "
    "(docs/operations/poolers.md)"
)
# SQLSTATEs of a statement name the server connection does not know, or already knows
LOST_PREPARED_STATEMENT = {"26000", "42P05"}  # invalid_sql_statement_name, duplicate_prepared


def behind_transaction_pooler() -> bool:
    db = settings.DATABASES.get(engine_alias(), {})
    return db.get("ENGINE") == "django.db.backends.postgresql" and bool(
        db.get("DISABLE_SERVER_SIDE_CURSORS")
    )


def lost_prepared_statement(exc: BaseException) -> bool:
    """Whether `exc` (Django's wrapper, or psycopg's own error) says a prepared statement is
    missing from the server connection, or already there: what a transaction pooler does to
    a client that prepares."""
    if isinstance(exc, TransactionPoolerError):
        return True
    for err in (exc, exc.__cause__):
        if getattr(err, "sqlstate", None) in LOST_PREPARED_STATEMENT:
            return True
    return False


def explained(exc: BaseException) -> BaseException:
    """`exc`, or a TransactionPoolerError naming the settings when a pooler caused it."""
    if isinstance(exc, TransactionPoolerError) or not lost_prepared_statement(exc):
        return exc
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return TransactionPoolerError(
        f"{cause}: a transaction pooler (PgBouncer in transaction mode) keeps no prepared "
        f"statement between transactions; {SETTINGS_TO_CHANGE}"
    )


def undeclared_pooler_seen(alias: str | None = None, rounds: int = 3) -> bool:
    """Whether a transaction pooler the settings do not declare stands between this process
    and PostgreSQL: two connections of its own, each statement its own transaction, reach the
    same server session (a pooler in transaction mode hands the server connection the first
    just released to the second; without one, or in session mode, every connection has a
    backend of its own). False on SQLite, when the pooler is declared, or when the database
    cannot be reached (the worker's outage handling reports that). A pooler that hands out
    its server connections round-robin may go unseen here; TransactionPoolerError names the
    settings then, at the first statement it breaks."""
    conn = connections[alias or engine_alias()]
    if conn.vendor != "postgresql" or behind_transaction_pooler():
        return False
    opened: list[Any] = []
    try:
        with conn.wrap_database_errors:
            params = conn.get_connection_params()
            for _ in range(2):
                raw = conn.get_new_connection(params)
                opened.append(raw)
                raw.autocommit = True  # a transaction would hold its server connection
            for _ in range(rounds):
                for first, second in (opened, opened[::-1]):
                    if _backend_pid(first) == _backend_pid(second):
                        return True
    except DjangoDbError:
        return False
    finally:
        for raw in opened:
            with contextlib.suppress(Exception):
                raw.close()
    return False


def _backend_pid(raw: Any) -> int:
    with raw.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return int(cur.fetchone()[0])
