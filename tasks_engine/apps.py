from django.apps import AppConfig


class TasksEngineConfig(AppConfig):
    name = "tasks_engine"
    verbose_name = "Durable tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.utils.module_loading import autodiscover_modules

        from . import backends, checks, logs, sql  # noqa: F401 - checks; the django_task workflow

        logs.configure()
        connection_created.connect(sql.prepare_engine_statements, weak=False)
        autodiscover_modules("workflows")
