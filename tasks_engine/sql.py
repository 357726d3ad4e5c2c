"""Dialect differences in one place: parameter adaptation and the few clauses that differ.

PostgreSQL takes row locks (`FOR SHARE`, `FOR UPDATE SKIP LOCKED`); SQLite has one writer at a
time, so each statement is already serialised and the locking clauses are dropped.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, models

_DT = models.DateTimeField()
_JSON = models.JSONField(null=True)


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def share_lock() -> str:
    """Row lock that makes a fenced write wait for (or lose to) a concurrent reclaim."""
    return " FOR SHARE" if is_postgres() else ""


def skip_locked() -> str:
    return " FOR UPDATE SKIP LOCKED" if is_postgres() else ""


def new_token_sql() -> str:
    """A fresh random lease token per row, in the column's storage format."""
    return "gen_random_uuid()" if is_postgres() else "lower(hex(randomblob(16)))"


def p_uuid(value: uuid.UUID | str | None) -> Any:
    if value is None:
        return None
    u = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return u if is_postgres() else u.hex


def p_dt(value: datetime | None) -> Any:
    return _DT.get_db_prep_value(value, connection) if value is not None else None


def p_json(value: Any) -> Any:
    return _JSON.get_db_prep_value(value, connection) if value is not None else None


def r_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


def execute(sql: str, params: Sequence[Any] = ()) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def fetchall(sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())
