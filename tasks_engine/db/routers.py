"""`EngineRouter`: the engine's models read, write and migrate on `TASKS_ENGINE["DATABASE"]`.

    DATABASE_ROUTERS = ["tasks_engine.db.routers.EngineRouter"]

Needed when the engine's tables are not on "default" (tasks_engine.E041 says so otherwise);
harmless when they are. Other apps' models are left to the next router (or "default")."""

from __future__ import annotations

from typing import Any

from .alias import engine_alias

APP_LABEL = "tasks_engine"


class EngineRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return engine_alias() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return engine_alias() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        """The engine's tables on its alias only; other apps are not this router's business."""
        if app_label == APP_LABEL:
            return db == engine_alias()
        return None
