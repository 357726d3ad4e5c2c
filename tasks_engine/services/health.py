"""`manage.py tasks health`: is this deployment ready? For a container's readiness probe.

Ready means: the engine's database answers, every migration of every installed app is applied,
and every (task, version) with runs that are due now (pending, available) has a live worker
that serves it in its queue. Each problem is one line. It reads and never writes: a missing
SQLite file is reported, not created; the migration table is read, never made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connections, router
from django.db.migrations.executor import MigrationExecutor

from ..models import WorkflowRun
from ..values.secrets import redact_text
from .fleet import live_filters, serves
from .run_groups import due_pending_groups

SHOWN_MIGRATIONS = 5  # a fresh database lacks dozens: the line names the first few


@dataclass(frozen=True)
class Health:
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": self.problems}


def check_health() -> Health:
    alias = router.db_for_write(WorkflowRun)
    connection = connections[alias]
    if missing := _missing_sqlite_file(connection.settings_dict):
        return Health([f"database {alias!r} unreachable: {missing}"])
    try:
        connection.ensure_connection()
    except DatabaseError as exc:
        return Health([f"database {alias!r} unreachable: {_one_line(exc)}"])
    try:
        unapplied = _unapplied_migrations(connection)
        problems = [_migrations_line(unapplied)] if unapplied else []
        if not any(app == WorkflowRun._meta.app_label for app, _ in unapplied):
            problems += unserved_due_runs()  # only once the runs table is what the code expects
    except DatabaseError as exc:
        return Health([f"database {alias!r} cannot be read: {_one_line(exc)}"])
    return Health(problems)


def _missing_sqlite_file(db: dict[str, Any]) -> str | None:
    """SQLite creates a file it is asked to open: a probe must not."""
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return None
    name = str(db.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:") or Path(name).exists():
        return None
    return f"the SQLite file {name} does not exist"


def _unapplied_migrations(connection: Any) -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)  # reads django_migrations; a missing one: none
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [(migration.app_label, migration.name) for migration, backwards in plan]


def _migrations_line(unapplied: list[tuple[str, str]]) -> str:
    names = [f"{app}.{name}" for app, name in unapplied[:SHOWN_MIGRATIONS]]
    more = len(unapplied) - len(names)
    listed = ", ".join(names) + (f" and {more} more" if more else "")
    return f"{len(unapplied)} migration(s) not applied (manage.py migrate): {listed}"


def unserved_due_runs(using: str | None = None) -> list[str]:
    """A line per (task, version, queue) with due pending runs that no live worker serves.
    `using`: the alias to read (the admin's banner reads its replica), else the engine's."""
    groups = due_pending_groups(using)
    if not groups:
        return []
    live = live_filters(using)
    return [
        f"{g.count_label} due pending run(s) of {g.task}@{g.version} in queue {g.queue!r}: "
        + ("no live worker serves it" if live else "no worker is alive")
        for g in groups
        if not any(serves(w, g.task, g.version, g.queue) for w in live)
    ]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_text(text)
