"""Tasks for the port of Django's own tasks tests (tests/django_tasks), run by real workers.

The first group stands for Django's `tests/tasks/tasks.py` (same names and behaviour, written
anew); the rest serve behaviours from Django's documentation and issue 20.

Worker-side recording: when a process imports this module with `DJANGO_TASKS_RECORD` set to a
file path (the tests set it for their `runworker`), every `task_started`/`task_finished` it
sends and every `django.tasks` log record it emits is appended to that file as one JSON line,
so the tests can assert on what the worker's process sent and logged.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime
from typing import Any

from django.tasks import TaskContext, TaskResult, task
from django.tasks.signals import task_finished, task_started

from .models import SideEffect

# -- Django's tests/tasks/tasks.py --------------------------------------------------------------


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This Task failed due to KeyboardInterrupt")


@task()
def exit_task() -> None:
    exit(1)


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    return lambda: True  # neither JSON nor picklable


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def context_matches(context: TaskContext, attempt: int) -> None:
    """Django's `test_context` task (renamed so pytest never collects it)."""
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


# -- documented behaviours and issue 20 ----------------------------------------------------------


@task()
def double_dictionary(key: Any) -> dict[Any, Any]:
    """docs/topics/tasks.txt: a tuple argument arrives as a list, which cannot be a key."""
    return {key: key * 2}


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task()
def divide_by_zero() -> float:
    return 1 / 0


@task()
def missing_datetime_key() -> Any:
    return {}[datetime(2020, 1, 2, 3, 4, 5)]


@task()
def returns(value: str) -> Any:
    """Returns a value JSON cannot hold: "nul" -> a string with NUL, "nan", "inf"."""
    return {"nul": "a\x00b", "nan": float("nan"), "inf": float("inf")}[value]


@task()
def read_side_effect(key: str) -> str:
    """docs/topics/tasks.txt "Transactions": reads a row the enqueuing transaction wrote."""
    return SideEffect.objects.get(key=key).key


@task()
def wait_for_release(key: str, timeout: float = 20.0) -> str:
    """Runs until a SideEffect row `<key>:release` exists, so a test can see it RUNNING."""
    end = time.monotonic() + timeout
    while not SideEffect.objects.filter(key=f"{key}:release").exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{key} was never released")
        time.sleep(0.05)
    return key


# -- worker-side recording -----------------------------------------------------------------------

RECORD_ENV = "DJANGO_TASKS_RECORD"
_record_lock = threading.Lock()


def _append(path: str, entry: dict[str, Any]) -> None:
    line = json.dumps({**entry, "pid": os.getpid()}) + "\n"
    with _record_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line)


class _RecordLogs(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.DEBUG)
        self.path = path
        # The format of unittest's assertLogs output, which Django's tests assert on.
        self.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        _append(
            self.path,
            {"kind": "log", "level": record.levelname, "output": self.format(record)},
        )


def _record_signal(sender: Any, task_result: TaskResult, signal: Any, **kwargs: Any) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        _append(
            path,
            {
                "kind": "started" if signal is task_started else "finished",
                "id": task_result.id,
                "status": str(task_result.status),
                "sender": f"{sender.__module__}.{sender.__qualname__}",
                "backend": task_result.backend,
                "task_backend": task_result.task.backend,
                "errors": [e.exception_class_path for e in task_result.errors],
            },
        )


def _install_recorder() -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    task_started.connect(_record_signal, dispatch_uid="ported-tasks-started")
    task_finished.connect(_record_signal, dispatch_uid="ported-tasks-finished")
    logger = logging.getLogger("django.tasks")
    if not any(isinstance(h, _RecordLogs) for h in logger.handlers):
        logger.addHandler(_RecordLogs(path))


_install_recorder()
