"""System checks for the engine's configuration."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from .conf import engine_settings


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    try:
        s = engine_settings()
    except (TypeError, ValueError) as exc:
        return [checks.Error(f"TASKS_ENGINE is invalid: {exc}", id="tasks_engine.E001")]
    if s.lease_seconds <= 0:
        errors.append(
            checks.Error("TASKS_ENGINE LEASE_SECONDS must be > 0", id="tasks_engine.E002")
        )
    if s.heartbeat >= s.lease_seconds:
        errors.append(
            checks.Error(
                "TASKS_ENGINE HEARTBEAT_SECONDS must be shorter than LEASE_SECONDS",
                hint="Leave it None to use a third of the lease.",
                id="tasks_engine.E003",
            )
        )
    if s.poll_interval <= 0:
        errors.append(
            checks.Error("TASKS_ENGINE POLL_INTERVAL must be > 0", id="tasks_engine.E004")
        )
    errors += _sqlite_atomic_step_bound(s)
    return errors


def _sqlite_atomic_step_bound(s: Any) -> list[checks.CheckMessage]:
    """On SQLite an atomic step holds the only write lock while its code runs: warn when the
    bound lets it hold that lock long enough for other workers' leases to lapse. A sound bound
    says nothing: a warning on every SQLite start would be noise."""
    bound = s.sqlite_atomic_step_seconds
    if bound is not None and bound < 0:
        return [
            checks.Error(
                "TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS must be >= 0 (0 or None: no bound)",
                id="tasks_engine.E005",
            )
        ]
    if not any(db["ENGINE"] == "django.db.backends.sqlite3" for db in settings.DATABASES.values()):
        return []
    hint = (
        "An atomic step holds SQLite's only write lock while its code runs, and every "
        "worker's writes (lease renewals too) wait for it. Keep SQLITE_ATOMIC_STEP_SECONDS "
        f"at most half of LEASE_SECONDS ({s.lease_seconds / 2:g}s); see docs/SQLITE.md."
    )
    if not bound:
        return [
            checks.Warning(
                "TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS is disabled: on SQLite a frozen "
                "atomic step stalls every worker",
                hint=hint,
                id="tasks_engine.W001",
            )
        ]
    if bound > s.lease_seconds / 2:
        return [
            checks.Warning(
                f"TASKS_ENGINE SQLITE_ATOMIC_STEP_SECONDS ({bound:g}s) is more than half of "
                f"LEASE_SECONDS ({s.lease_seconds:g}s): on SQLite other workers' leases can "
                "lapse while an atomic step holds the write lock",
                hint=hint,
                id="tasks_engine.W001",
            )
        ]
    return []


@checks.register(deploy=True)
def check_unserved_runs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy`: unfinished runs whose (task, version) and queue no live worker serves
    (a version retired by a deploy while runs of it were mid-way, a queue nobody listens to).
    Only once workers are known: with no live worker row nothing can be said. Says nothing
    when the database cannot be read (not migrated yet, or down): this is advice, not a gate."""
    from django.db import DatabaseError, transaction

    from .workers import unserved_runs

    try:
        with transaction.atomic():  # a failed read inside a caller's transaction stays contained
            unserved = unserved_runs()
    except DatabaseError:
        return []
    return [
        checks.Warning(
            f"{u['runs']} unfinished run(s) of {u['task']}@{u['version']} in queue "
            f"{u['queue']!r}: no live worker serves this task version and queue",
            hint="Start a worker that registers this version and serves this queue, or "
            "cancel the runs (manage.py tasks workers lists what each worker serves).",
            obj=f"{u['task']}@{u['version']}",
            id="tasks_engine.W002",
        )
        for u in unserved or []
    ]
