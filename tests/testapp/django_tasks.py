"""Django tasks (`@django.tasks.task`) the backend tests enqueue; workers import them by path."""

from __future__ import annotations

import os
import time
from typing import Any

import django
from django.dispatch import receiver
from django.tasks import TaskContext, TaskResult, task
from django.tasks.signals import task_finished, task_started

from .models import SideEffect


class TaskBoom(Exception):
    pass


def _effect(key: str) -> None:
    SideEffect.objects.create(key=key, worker=os.environ.get("WORKER_TAG", ""))


@receiver(task_started, dispatch_uid="testapp-task-started")
@receiver(task_finished, dispatch_uid="testapp-task-finished")
def _record_signal(sender: Any, task_result: TaskResult, signal: Any, **kwargs: Any) -> None:
    """Rows `signal:<started|finished>:<status>:<result id>`, so tests see what workers sent."""
    if task_result.task.func.__module__ == __name__:
        name = "started" if signal is task_started else "finished"
        _effect(f"signal:{name}:{task_result.status}:{task_result.id}")


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def boom(message: str) -> None:
    _effect(f"boom:{message}")
    raise TaskBoom(message)


def durable_task(**options: Any) -> Any:
    """`@task(**options)` with the durable backend's options (max_attempts, idempotency_key):
    Django 6.1 passes them to the backend's task class. Django 6.0's `@task` takes only its own
    options; there the same task is made with `.using(**options)` (docs: README)."""
    if django.VERSION >= (6, 1):
        return task(**options)
    return lambda func: task(func).using(**options)


@durable_task(max_attempts=3)
def flaky(key: str, fail_times: int) -> str:
    """Fails on its first `fail_times` calls (counted in SideEffect rows), then succeeds."""
    _effect(key)
    calls = SideEffect.objects.filter(key=key).count()
    if calls <= fail_times:
        raise TaskBoom(f"{key}: failure {calls}")
    return f"{key}: ok after {calls}"


@task
def record(key: str) -> str:
    _effect(key)
    return key


@task(takes_context=True)
def with_context(context: TaskContext, value: int) -> dict[str, Any]:
    return {
        "value": value,
        "id": context.task_result.id,
        "attempt": context.attempt,
        "status": str(context.task_result.status),
    }


@task
async def async_double(value: int) -> int:
    return value * 2


@durable_task(idempotency_key="order:{order_id}")
def ship_order(order_id: int, note: str = "") -> str:
    _effect(f"ship:{order_id}")
    return f"shipped {order_id}"


@task
def slow(key: str, seconds: float) -> str:
    _effect(f"{key}:start")
    time.sleep(seconds)
    _effect(f"{key}:end")
    return key


@task
def returns_object() -> Any:
    return object()


def not_a_task() -> None:
    """A plain function: a run that names it fails with a clear error."""
