"""A database alias added for one test (the engine's own database, a replica): a fresh database
(a PostgreSQL database on a server, or an SQLite file), in DATABASES and Django's connections
while the test runs, dropped after it. `engine_on(alias)` points TASKS_ENGINE["DATABASE"] at it.
Each alias name is used for one vendor only (tasks_engine.db.sql caches an alias's vendor)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import override_settings

# Django's test cases refuse connections to aliases they were not given (patching this method
# while a test runs); an alias added here is the test's own database, made and dropped by it.
# pytest-django's blocker keeps the real method (while collecting, the method is its refusal).
_ENSURE_CONNECTION = (
    getattr(
        getattr(BaseDatabaseWrapper.ensure_connection, "__self__", None),
        "_real_ensure_connection",
        None,
    )
    or BaseDatabaseWrapper.ensure_connection
)

SERVER = "postgres://postgres@127.0.0.1:5432"  # the shared server (tests run against it)


def pg_settings(url: str) -> dict[str, Any]:
    import environ

    return dict(environ.Env.db_url_config(url))


def sqlite_settings(path: Path) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
        },
    }


@contextmanager
def alias(name: str, db: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`db` (a DATABASES entry) as alias `name` while the block runs."""
    full = copy.deepcopy(settings.DATABASES["default"])
    full.pop("TEST", None)
    full.update(db)
    full["OPTIONS"] = dict(db.get("OPTIONS") or {})
    full.setdefault("TEST", {})
    for key in ("USER", "PASSWORD", "HOST", "PORT"):
        full.setdefault(key, "")
    if full["ENGINE"].endswith("sqlite3"):
        for key in ("USER", "PASSWORD", "HOST", "PORT"):
            full[key] = ""
    settings.DATABASES[name] = full
    try:
        with mock.patch.object(BaseDatabaseWrapper, "ensure_connection", _allowed(name)):
            yield full
    finally:
        connections[name].close()
        del connections[name]
        del settings.DATABASES[name]


def _allowed(name: str) -> Any:
    refusing = BaseDatabaseWrapper.ensure_connection

    def ensure_connection(self: BaseDatabaseWrapper, *args: Any, **kwargs: Any) -> Any:
        if (
            self.alias in settings.DATABASES
            and self.alias not in ("default",)
            and (self.alias == name or refusing is _ENSURE_CONNECTION)
        ):
            return _ENSURE_CONNECTION(self, *args, **kwargs)
        return refusing(self, *args, **kwargs)

    return ensure_connection


@contextmanager
def new_pg_database(prefix: str = "umt_enginedb", server: str = SERVER) -> Iterator[str]:
    """A fresh PostgreSQL database on `server`; its URL. Dropped (connections forced off) after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server}/{name}"
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_server_reachable(server: str = SERVER) -> bool:
    try:
        with psycopg.connect(f"{server}/postgres", connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def engine_on(name: str, **more: Any) -> override_settings:
    return override_settings(
        TASKS_ENGINE={**settings.TASKS_ENGINE, "DATABASE": name, **more},
    )


def migrate(name: str) -> None:
    call_command("migrate", database=name, verbosity=0, interactive=False)


def tables(name: str) -> set[str]:
    conn = connections[name]
    with conn.cursor() as cur:
        return set(conn.introspection.table_names(cur))


@contextmanager
def engine_database(name: str, vendor: str, sqlite_path: Path) -> Iterator[str]:
    """The engine on a fresh, migrated database of `vendor` under the alias `name` (a new
    PostgreSQL database on the shared server, or an SQLite file at sqlite_path); yields its URL.
    """
    with ExitStack() as stack:
        if vendor == "postgresql":
            if not pg_server_reachable():
                pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
            url = stack.enter_context(new_pg_database())
            stack.enter_context(alias(name, pg_settings(url)))
        else:
            url = f"sqlite:///{sqlite_path}"
            stack.enter_context(alias(name, sqlite_settings(sqlite_path)))
        stack.enter_context(engine_on(name))
        migrate(name)
        yield url
