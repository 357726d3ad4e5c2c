"""TASKS for the ported tests: the test process overrides TASKS with it, workers start with it
(worker_settings.py), so that both sides know the second alias."""

from __future__ import annotations

from typing import Any

BACKEND = "tasks_engine.backends.DurableBackend"

TASKS: dict[str, Any] = {
    "default": {"BACKEND": BACKEND},  # no QUEUES: Django's default, {"default"}
    "other": {"BACKEND": BACKEND, "QUEUES": []},  # an empty list accepts any queue name
}
