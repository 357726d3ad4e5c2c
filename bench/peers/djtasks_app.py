"""Minimal Django settings and the benchmark's task for the django-tasks-db driver: one
database (from $BENCH_DJTASKS_DSN), the django_tasks_db app and its DatabaseBackend."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.tasks import task

_url = urlsplit(os.environ.get("BENCH_DJTASKS_DSN", "postgres://postgres@127.0.0.1/bench"))

SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "postgres",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "127.0.0.1",
        "PORT": str(_url.port or 5432),
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
LOGGING_CONFIG = None


@task()
def noop(k: int | None = None) -> None:
    if k is not None:
        from harness import record_pickup

        record_pickup(k)
