from django.apps import AppConfig


class TasksEngineConfig(AppConfig):
    name = "tasks_engine"
    verbose_name = "Durable tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.utils.module_loading import autodiscover_modules

        from . import backends, checks, logs  # noqa: F401 - checks; the django_task workflow

        logs.configure()
        autodiscover_modules("workflows")
