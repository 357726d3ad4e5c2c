"""System checks for the engine's configuration."""

from __future__ import annotations

from typing import Any

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
    return errors
