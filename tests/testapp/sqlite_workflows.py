"""Workflows for SQLite's bounds: atomic steps that keep the single write lock too long."""

from __future__ import annotations

import threading

from django.db import connection
from pydantic import BaseModel

from tasks_engine import TaskContext, workflow

from .models import Marker

# The test drives these: the step sets `entered` once its first write is in its transaction,
# then waits (holding SQLite's write lock) until `release` is set or `hold` seconds pass.
entered = threading.Event()
release = threading.Event()


class Hold(BaseModel):
    key: str
    hold: float = 0.0  # seconds the step keeps its transaction open after its write
    statement: bool = False  # hold it with a statement that never ends instead of a wait
    write_after: bool = False  # write once more after the hold


@workflow(name="sqlite_atomic_hold", input=Hold)
def sqlite_atomic_hold(ctx: TaskContext) -> str:
    def body() -> str:
        Marker.objects.create(key=ctx.input.key)
        entered.set()
        if ctx.input.statement:
            with connection.cursor() as cur:  # counts for ever: only an interrupt ends it
                cur.execute(
                    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
                    "SELECT count(*) FROM n"
                )
        else:
            release.wait(ctx.input.hold)
        if ctx.input.write_after:
            Marker.objects.create(key=f"{ctx.input.key}:after")
        return "committed"

    return ctx.step.run("hold", body, atomic=True)


@workflow(name="sqlite_atomic_catches", input=Hold)
def sqlite_atomic_catches(ctx: TaskContext) -> str:
    """The workflow catches the bound's error and goes on: the step's write is gone."""

    def body() -> str:
        Marker.objects.create(key=ctx.input.key)
        release.wait(ctx.input.hold)
        return "committed"

    try:
        return ctx.step.run("hold", body, atomic=True)
    except Exception as exc:  # noqa: BLE001 - the test reads what was caught
        return f"caught {type(exc).__name__}"
