from django.apps import AppConfig


class TasksEngineConfig(AppConfig):
    name = "tasks_engine"
    verbose_name = "Durable tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate
        from django.utils.module_loading import autodiscover_modules

        from . import backends, checks, logs, sql, sqlite_bounds  # noqa: F401 - checks; django_task

        logs.configure()
        connection_created.connect(sql.prepare_engine_statements, weak=False)
        # SQLite: planner statistics, so the claim reads its partial indexes (sqlite_bounds.py)
        post_migrate.connect(sqlite_bounds.analyze_after_migrate, sender=self, weak=False)
        autodiscover_modules("workflows")

        from . import schedules, services

        services.register("schedules", schedules.run_once, every=schedules.EVERY_SECONDS)
