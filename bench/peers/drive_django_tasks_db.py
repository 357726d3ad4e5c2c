"""django-tasks-db driver: Django's task framework (django.tasks) with the django_tasks_db
DatabaseBackend; Task.enqueue in autocommit (one transaction each; the queue is filled inside
one transaction.atomic block), and the backend's own `db_worker` command as the worker, on its
defaults (1 s polling when idle). db_worker runs one task at a time, so a process's concurrency
is 1 whatever --concurrency says. Run with the peers' venv python."""

from __future__ import annotations

import os

import harness

a = harness.parse_args(__doc__)
os.environ["BENCH_DJTASKS_DSN"] = a.dsn
os.environ["DJANGO_SETTINGS_MODULE"] = "djtasks_app"


def django_ready() -> None:
    import django

    django.setup()


def setup() -> None:
    django_ready()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def enqueue_each(n: int) -> None:
    from djtasks_app import noop

    for _ in range(n):
        noop.enqueue()


def enqueue_bulk(n: int) -> None:
    from django.db import transaction
    from djtasks_app import noop

    with transaction.atomic():
        for _ in range(n):
            noop.enqueue()


def enqueue_timed(k: int) -> None:
    from djtasks_app import noop

    noop.enqueue(k=k)


def close() -> None:
    from django.db import connections

    connections.close_all()


if __name__ == "__main__":
    if a.role == "worker":
        django_ready()
        from django.core.management import call_command

        harness.mark_ready()
        call_command("db_worker", verbosity=0)
    else:
        result = harness.run_conductor(
            a,
            __file__,
            {
                "setup": setup,
                "close": close,
                "enqueue_each": enqueue_each,
                "enqueue_bulk": enqueue_bulk,
                "enqueue_timed": enqueue_timed,
                "concurrency": 1,
                "progress_sql": "SELECT count(*) FILTER (WHERE status = 'READY'),"
                " count(*) FILTER (WHERE status IN ('SUCCESSFUL', 'FAILED'))"
                " FROM django_tasks_database_dbtaskresult",
            },
        )
        harness.emit({"peer": "django-tasks-db", **result})
