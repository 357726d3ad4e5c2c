"""PARTITION's switch: after every migrate of the engine's alias (post_migrate) and on
`tasks partition`, the run tables are converted if they are not partitioned yet, and the
current and next periods' partitions made."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS

from ..alias import engine_alias
from . import unit
from .convert import convert
from .periods import AHEAD, ensure_ahead


def turn_on(ahead: int = AHEAD) -> tuple[list[str], list[str]]:
    """(tables converted, partitions made); nothing to do without PARTITION on PostgreSQL."""
    period = unit()
    if period is None:
        return [], []
    converted = convert(period, ahead)
    return converted, ensure_ahead(period, ahead, lock_timeout=False)


def after_migrate(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    if using == engine_alias():
        turn_on()
