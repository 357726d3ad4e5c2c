"""Where the engine's tables live: the one place that names the database alias of every engine
statement (`TASKS_ENGINE["DATABASE"]`, default "default"), and the alias the admin's pages
read from (`TASKS_ENGINE["ADMIN_READ_DATABASE"]`, default the engine's).

Every engine module asks here: `connection` is the engine alias's connection (Django's own
`django.db.connection` is the default alias's), `atomic()` and `on_commit()` are Django's on
the engine alias. The ORM reaches the alias through `routers.EngineRouter`, which a project
whose engine is not on "default" lists in `DATABASE_ROUTERS` (tasks_engine.E041 says so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils.connection import ConnectionProxy

from ..conf import engine_settings


def engine_alias() -> str:
    """The alias of the engine's tables. (With a TASKS_ENGINE that does not parse, which
    `manage.py check` reports as tasks_engine.E001, its DATABASE as given, so that the router
    still answers while the checks run.)"""
    try:
        return engine_settings().database
    except (TypeError, ValueError):
        raw = getattr(settings, "TASKS_ENGINE", None) or {}
        return str(raw.get("DATABASE") or DEFAULT_DB_ALIAS)


def admin_read_alias() -> str:
    """The alias the admin's lists and run pages read from (a replica, or the engine's)."""
    return engine_settings().admin_read_database or engine_settings().database


class _EngineConnection(ConnectionProxy):
    """`django.db.connection`, but of the engine's alias, looked up at each use (a settings
    override in tests may change it)."""

    def __init__(self) -> None:
        self.__dict__["_connections"] = connections

    @property
    def _alias(self) -> str:  # type: ignore[override]
        return engine_settings().database


connection: Any = _EngineConnection()


def atomic(*, savepoint: bool = True, durable: bool = False) -> transaction.Atomic:
    """`transaction.atomic()` on the engine's alias."""
    return transaction.atomic(
        using=engine_settings().database, savepoint=savepoint, durable=durable
    )


def on_commit(func: Callable[[], Any], *, robust: bool = False) -> None:
    """`transaction.on_commit` of the engine alias's transaction."""
    transaction.on_commit(func, using=engine_settings().database, robust=robust)


def get_rollback() -> bool:
    return transaction.get_rollback(using=engine_settings().database)
