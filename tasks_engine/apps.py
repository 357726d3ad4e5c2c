from django.apps import AppConfig


class TasksEngineConfig(AppConfig):
    name = "tasks_engine"
    verbose_name = "Durable tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import checks, logs  # noqa: F401 - registers the system checks

        logs.configure()
        autodiscover_modules("workflows")
