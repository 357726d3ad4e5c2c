"""Transactional outbox: publish events with your writes, dispatch them exactly once."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks as django_checks
        from django.utils.module_loading import autodiscover_modules

        from tasks_engine.db.sqlite_bounds import register_hints
        from tasks_engine.services.retention import register_pruner

        from . import checks
        from .conf import outbox_settings
        from .maintenance import prune_dispatched
        from .models import SQLITE_HINTS, OutboxEvent

        django_checks.register(checks.check_settings)
        register_hints("outbox_events", lambda: OutboxEvent._meta.db_table, SQLITE_HINTS)
        register_pruner(
            "outbox_events",
            lambda cutoff, batch, max_batches: prune_dispatched(
                cutoff, batch=batch, max_batches=max_batches
            ),
            retention=lambda: outbox_settings().retention,
        )
        autodiscover_modules("outbox_routes")
