"""Helpers of the partition tests: a fresh PostgreSQL engine database (alias `engine_part`)
with TASKS_ENGINE["PARTITION"], run ids of any moment, and where a row lives."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from tasks_engine.db.partitions.setup import turn_on
from tasks_engine.models import WorkflowRun

from . import aliases

ALIAS = "engine_part"


def v7_at(moment: datetime) -> uuid.UUID:
    """A version 7 run id made at `moment` (random below its millisecond)."""
    ms = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1000)
    rand = int.from_bytes(os.urandom(10))
    return uuid.UUID(
        int=ms << 80 | 0x7000 << 64 | (rand >> 62) % (1 << 12) << 64 | 0b10 << 62 | rand % (1 << 62)
    )


@contextmanager
def engine_database(partition: str | None = "month", **more: Any) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database as the engine's alias; with `partition`, its run
    tables converted (migrate's post_migrate does it)."""
    if not aliases.pg_server_reachable():
        pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
    with ExitStack() as stack:
        url = stack.enter_context(aliases.new_pg_database("umt_part"))
        stack.enter_context(aliases.alias(ALIAS, aliases.pg_settings(url)))
        stack.enter_context(aliases.engine_on(ALIAS, PARTITION=partition, **more))
        aliases.migrate(ALIAS)
        yield ALIAS


def partitioned(alias: str = ALIAS, ahead: int = 2) -> tuple[list[str], list[str]]:
    return turn_on(ahead)


def where(table: str, column: str, value: Any, alias: str = ALIAS) -> list[str]:
    """The partitions of `table` whose rows have `column` = value."""
    with connections[alias].cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {column} = %s", [value])
        return [name for (name,) in cur.fetchall()]


def scalar(sql: str, params: Any = (), alias: str = ALIAS) -> Any:
    with connections[alias].cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None else row[0]


def make_periods(*moments: datetime, unit: str = "month") -> None:
    """The partitions of the periods holding `moments` (the maintenance makes periods from
    now on only; these tests write history of past ones)."""
    from tasks_engine.db.partitions import TABLES, bounds, periods

    for moment in moments:
        for table in TABLES:
            periods.create_period(table, bounds.period_start(moment, unit), unit)


def finished_runs(moment: datetime, n: int) -> list[WorkflowRun]:
    """`n` completed runs (unsaved) created at `moment`, their ids a second apart from it."""
    return [
        WorkflowRun(
            id=v7_at(moment + timedelta(seconds=i)),
            task_name="noop",
            status="completed",
            input={},
            created_at=moment,
            updated_at=moment,
            finished_at=moment,
        )
        for i in range(n)
    ]
