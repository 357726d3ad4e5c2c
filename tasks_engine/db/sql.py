"""Dialect differences in one place: parameter adaptation and the few clauses that differ.

PostgreSQL takes row locks (`FOR SHARE`, `FOR UPDATE SKIP LOCKED`); SQLite has one writer at a
time, so each statement is already serialised and the locking clauses are dropped.
"""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import ProgrammingError, connections, models
from django.db.models.functions import Now

from . import pooler
from .alias import connection, engine_alias

_DT = models.DateTimeField()
NEVER_AUTOMATICALLY = 2**31 - 1  # psycopg prepare_threshold: prepare only on prepare=True
# psycopg keeps its conversion of a statement's %s placeholders only for statements up to 4096
# characters; a longer one is converted again at each execution (90 us for the guarded claim's
# 5,024 characters, 110 us for a 10-step group's with its claim, on the machine of
# bench/PROFILE.md). The engine's statements are a few dozen shapes: keep them all.
LONGEST_STATEMENT = 16384
_JSON = models.JSONField(null=True)


def is_postgres() -> bool:
    return _vendor(engine_alias()) == "postgresql"


@functools.cache
def _vendor(alias: str) -> str:
    # An alias's backend does not change in a process. (The lookup through Django's
    # thread-local connection proxy is a hot-path cost otherwise.)
    return connections[alias].vendor


# -- named queries ----------------------------------------------------------------------------

QUERIES = Path(__file__).parent / "queries"
_HEADER = re.compile(r"^-- (\w+) --\n-- .*\n", re.MULTILINE)


@functools.cache
def _queries(vendor: str) -> dict[str, str]:
    """`queries/<vendor>.sql` parsed once: each query under `-- name --` and a description."""
    text = (QUERIES / f"{vendor}.sql").read_text()
    parts = _HEADER.split(text)  # ["", name, body, name, body, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    """The named query for the database in use (its `%(name)s` parameters unfilled)."""
    return _queries(_vendor(engine_alias()))[name]


Params = Sequence[Any] | Mapping[str, Any]


def share_lock() -> str:
    """Row lock that makes a fenced write wait for (or lose to) a concurrent reclaim."""
    return " FOR SHARE" if is_postgres() else ""


def skip_locked() -> str:
    return " FOR UPDATE SKIP LOCKED" if is_postgres() else ""


def new_token_sql() -> str:
    """A fresh random lease token per row, in the column's storage format."""
    return "gen_random_uuid()" if is_postgres() else "lower(hex(randomblob(16)))"


def db_now_sql(offset_seconds: float = 0.0) -> tuple[str, list[Any]]:
    """The database's clock plus an offset, as a SQL expression and its parameters. Times that
    processes on several hosts compare (worker beats, the leader's lease) come from one clock:
    PostgreSQL's. An SQLite file lives on one host, whose clock is the database's."""
    if is_postgres():
        return "(clock_timestamp() + %s * interval '1 second')", [offset_seconds]
    return "%s", [p_dt(datetime.now(UTC) + timedelta(seconds=offset_seconds))]


def db_now() -> models.Expression:
    """The database's clock as an ORM expression (see `db_now_sql`). Not Django's `Now()` on
    SQLite: it yields milliseconds ("...:05.123"), and the engine stores microseconds
    ("...:05.123456"), which compare as later text within the same millisecond, so a lease that
    ended that millisecond still read as held."""
    if is_postgres():
        return Now()
    return models.Value(datetime.now(UTC), output_field=models.DateTimeField())


def db_clock(using: str | None = None) -> datetime:
    """The database's time now (see `db_now_sql`); `using`: another alias's (a replica's)."""
    if not is_postgres():
        return datetime.now(UTC)
    with (connections[using] if using else connection).cursor() as cur:
        cur.execute("SELECT clock_timestamp()")
        return r_dt(cur.fetchone()[0])


def p_uuid(value: uuid.UUID | str | None) -> Any:
    if value is None:
        return None
    u = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return u if is_postgres() else u.hex


def p_dt(value: datetime | None) -> Any:
    if value is None:
        return None
    if value.tzinfo is not None and is_postgres():
        return value  # psycopg adapts an aware datetime as it is
    return _DT.get_db_prep_value(value, connection)


def p_json(value: Any) -> Any:
    return _JSON.get_db_prep_value(value, connection) if value is not None else None


def _json_scalar(value: Any) -> Any:
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_rows(rows: list[Any]) -> str:
    """Many rows (dicts keyed by column) as one JSON parameter (PostgreSQL:
    `json_to_recordset`), or a JSON array of values: one `json.dumps`
    instead of adapting every value, and one statement text whatever the number of rows.
    UUIDs and datetimes become their text forms, which PostgreSQL parses back exactly."""
    return json.dumps(rows, default=_json_scalar, separators=(",", ":"))


def r_dt(value: Any) -> datetime:
    """A datetime read by a raw statement (SQLite returns its text form, in UTC)."""
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def r_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def placeholders(n: int) -> str:
    return ", ".join(["%s"] * n)


def _server_side() -> bool:
    from ..conf import engine_settings

    return is_postgres() and engine_settings().prepared_statements


def execute(sql: str, params: Params = ()) -> int:
    if _server_side():
        return _pg(sql, params, fetch=False)  # type: ignore[return-value]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def fetchall(sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
    if _server_side():
        return _pg(sql, params, fetch=True)  # type: ignore[return-value]
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def prepare_engine_statements(sender: Any, connection: Any, **kwargs: Any) -> None:
    """On every new PostgreSQL connection (connection_created; no transaction is open yet, so
    the setting cannot be rolled back with one):

    - psycopg keeps the engine's longest statements converted (LONGEST_STATEMENT), prepared or
      not.
    - Django turns preparing off (for poolers), which also ignores prepare=True: turn it back on
      for the statements that ask, and only those (an ORM query is never prepared).
    - Plan them once. A custom plan per execution re-estimates `available_at <= now` against
      the indexes' actual ends, which grows with the table: with a million finished runs a
      claim took 1.0 ms instead of 0.6 (0.7 with a generic plan). Only prepared statements
      have cached plans, so ORM queries are unaffected."""
    from ..conf import engine_settings

    if connection.vendor != "postgresql":
        return
    keep_long_statements()
    if not engine_settings().prepared_statements:
        return
    raw = connection.connection
    if raw.prepare_threshold is None:
        raw.prepare_threshold = NEVER_AUTOMATICALLY
    with connection.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")


def keep_long_statements() -> None:
    """psycopg's cache of converted statements takes the engine's longest too (see
    LONGEST_STATEMENT; tests/engine/transitions/test_statements.py fails if psycopg drops the
    setting)."""
    from psycopg import _queries

    if _queries.MAX_CACHED_STATEMENT_LENGTH < LONGEST_STATEMENT:
        _queries.MAX_CACHED_STATEMENT_LENGTH = LONGEST_STATEMENT


def _pg(sql: str, params: Params, *, fetch: bool) -> int | list[tuple[Any, ...]]:
    """The engine's hot statements on PostgreSQL: server-side parameters and prepared
    statements, so neither side re-parses (or quotes) them each time.
    Django's error wrapping and query log (CaptureQueriesContext) still apply."""
    # The thread's connection looked up once (each attribute read through the `connection`
    # proxy looks it up again: 2.4 us each, four of them a statement).
    conn = connections[engine_alias()]
    conn.ensure_connection()  # a new connection is set up by prepare_engine_statements
    start = time.monotonic()
    try:
        with conn.wrap_database_errors:
            sql, cur = statement_cursor(conn.connection, sql)
            cur.execute(sql, params, prepare=True)  # the engine runs a handful of shapes, often
            result: int | list[tuple[Any, ...]] = cur.fetchall() if fetch else cur.rowcount
    except ProgrammingError as exc:
        raise pooler.explained(exc) from exc
    if conn.queries_logged:
        conn.queries_log.append({"sql": sql, "time": f"{time.monotonic() - start:.3f}"})
    return result


# The statements a connection keeps a cursor for (least recently used dropped first): the
# engine's shapes are a few dozen, group statements' combinations included.
KEPT_CURSORS = 64


def statement_cursor(raw: Any, sql: str) -> tuple[str, Any]:
    """A cursor of the psycopg connection `raw` kept for the statement `sql`, and the statement
    object that cursor last ran (pass that one to `execute`). psycopg keeps a cursor's
    adapters (its Transformer: the dumper of each parameter's type, looked up afresh in a new
    one) only while the cursor runs the same query object again; a new cursor per statement
    cost 30 to 40 us of the client's CPU per execution (bench/PROFILE.md, eighth session).
    Django's connections are per thread, so a connection's cursors are one thread's."""
    import psycopg

    kept: dict[str, tuple[str, Any]] | None = getattr(raw, "_engine_cursors", None)
    if kept is None:
        kept = {}
        raw._engine_cursors = kept
    entry = kept.pop(sql, None)
    if entry is None or entry[1].closed:
        if len(kept) >= KEPT_CURSORS:
            kept.pop(next(iter(kept)))[1].close()
        entry = (sql, psycopg.Cursor(raw))
    kept[sql] = entry  # last: the most recently used
    return entry
