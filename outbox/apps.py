"""Transactional outbox: publish events with your writes, dispatch them exactly once."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks as django_checks
        from django.utils.module_loading import autodiscover_modules

        from . import checks

        django_checks.register(checks.check_settings)
        autodiscover_modules("outbox_routes")
