from django.apps import AppConfig


class TasksEngineConfig(AppConfig):
    name = "tasks_engine"
    verbose_name = "Durable tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401
        from .conf import django_has_tasks
        from .db import sql, sqlite_bounds
        from .db.partitions import setup as partition_setup
        from .db.sqlite_connections import safe_connection_settings
        from .observe import logs, metrics
        from .services import registry

        if django_has_tasks():  # Django 6.0+: the django_task workflow the backend runs
            from . import backends  # noqa: F401
        logs.configure()
        register_services()
        connection_created.connect(sql.prepare_engine_statements, weak=False)
        # SQLite: BEGIN IMMEDIATE, busy timeout, WAL, synchronous=FULL where OPTIONS are silent
        connection_created.connect(safe_connection_settings, weak=False)
        # SQLite: planner statistics, so the claim reads its partial indexes (db/sqlite_bounds.py)
        post_migrate.connect(sqlite_bounds.analyze_after_migrate, sender=self, weak=False)
        # PostgreSQL with TASKS_ENGINE["PARTITION"]: the run tables partitioned (db/partitions/)
        post_migrate.connect(partition_setup.after_migrate, sender=self, weak=False)
        # tasks_runs{queue,status} on the leader's /metrics (a no-op unless it serves metrics)
        registry.register("metrics-run-counts", metrics.refresh_run_counts, every=15)
        autodiscover_modules("workflows")


DEAD_WORKERS_EVERY = 1.0  # seconds: a killed worker costs DEAD_WORKER_SECONDS plus about this
RETENTION_EVERY = 300.0
RETENTION_MAX_BATCHES = 20  # per status and round: a round stays short, the next goes on


def register_services() -> None:
    """The engine's own maintenance services, run by the leader (services/leader.py)."""
    from . import schedules, transitions
    from .services import partitions as partition_upkeep
    from .services import paused_timers, registry, retention

    registry.register("dead-workers", transitions.reap_dead_workers, every=DEAD_WORKERS_EVERY)
    registry.register(
        "orphaned-cancels", transitions.end_orphaned_cancels, every=DEAD_WORKERS_EVERY
    )
    registry.register(
        "retention",
        lambda: retention.prune_expired(max_batches=RETENTION_MAX_BATCHES),
        every=RETENTION_EVERY,
    )
    registry.register("schedules", schedules.run_once, every=schedules.EVERY_SECONDS)
    registry.register("paused-queues", paused_timers.run_once, every=paused_timers.EVERY_SECONDS)
    registry.register("partitions", partition_upkeep.run_once, every=partition_upkeep.EVERY_SECONDS)
