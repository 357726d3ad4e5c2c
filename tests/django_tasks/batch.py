"""One real worker for many ported tests: enqueue every case, run `runworker --burst` once,
then let each test assert on its case.

Django's tests enqueue on ImmediateBackend and assert at once; here enqueue and assertions are
separated by a worker process. What the worker's process sends and logs is read back from the
file `tests.testapp.ported_tasks` appends to (DJANGO_TASKS_RECORD).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.signals import task_enqueued
from django.test import override_settings

from tasks_engine.models import WorkflowRun
from tests.helpers import WorkerProcess
from tests.testapp.models import SideEffect
from tests.testapp.ported_tasks import RECORD_ENV

from . import config

WORKER_SETTINGS = "tests.django_tasks.worker_settings"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def capture_task_logs() -> Iterator[list[str]]:
    """`django.tasks` records of this process, formatted as unittest's assertLogs does."""
    logger = logging.getLogger("django.tasks")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@dataclass
class Case:
    enqueued: TaskResult  # what enqueue returned, before any worker ran
    enqueue_logs: list[str]  # django.tasks records the enqueue emitted in this process
    enqueued_signals: int  # task_enqueued sent in this process for it


@dataclass
class Batch:
    cases: dict[str, Case] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[str, TaskResult] = field(default_factory=dict)  # read mid-batch
    worker_log: str = ""

    def enqueue(self, name: str, enqueue: Callable[[], TaskResult]) -> TaskResult:
        sent: list[str] = []

        def on_enqueued(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
            sent.append(task_result.id)

        task_enqueued.connect(on_enqueued)
        try:
            with capture_task_logs() as lines:
                result = enqueue()
        finally:
            task_enqueued.disconnect(on_enqueued)
        self.cases[name] = Case(result, lines, sent.count(result.id))
        return result

    def result(self, name: str) -> TaskResult:
        """The case's result as stored now (after the worker), through its task's backend."""
        enqueued = self.cases[name].enqueued
        return enqueued.task.get_backend().get_result(enqueued.id)

    def signals(self, name: str) -> list[tuple[str, str]]:
        """(started|finished, status) the worker's process sent for the case, in order."""
        rid = self.cases[name].enqueued.id
        return [
            (r["kind"], r["status"])
            for r in self.records
            if r["kind"] in ("started", "finished") and r["id"] == rid
        ]

    def worker_records(self, name: str) -> list[dict[str, Any]]:
        rid = self.cases[name].enqueued.id
        return [r for r in self.records if r["kind"] != "log" and r["id"] == rid]

    def logs(self, name: str, level: str | None = None) -> list[str]:
        """The worker's django.tasks log lines naming the case's result id."""
        rid = self.cases[name].enqueued.id
        return [
            r["output"]
            for r in self.records
            if r["kind"] == "log" and rid in r["output"] and (level is None or r["level"] == level)
        ]


def run_worker(
    directory: Path,
    tag: str,
    *args: str,
    during: Callable[[], None] | None = None,
    timeout: float = 90.0,
) -> tuple[list[dict[str, Any]], str]:
    """Run one `runworker --burst` with the recorder on; `during` runs while it works.
    Returns the records of its process and its log."""
    record = directory / f"records-{tag}.jsonl"
    record.touch()
    env = {"DJANGO_SETTINGS_MODULE": WORKER_SETTINGS, RECORD_ENV: str(record)}
    cmd = ["runworker", "--burst", "--poll-interval", "0.1", *args]
    worker = WorkerProcess(cmd, directory, tag, env)
    try:
        if during is not None:
            during()
        code = worker.wait(timeout)
        log = worker.log()
        assert code == 0, log
    finally:
        worker.stop()
    lines = record.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line], log


def wait_for_status(result: TaskResult, status: TaskResultStatus, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result.refresh()
        if result.status == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"{result.id} never reached {status} (last {result.status})")


def batch_fixture(
    build: Callable[[Batch], None],
    *args: str,
    during: Callable[[Batch], None] | None = None,
) -> Any:
    """A module-scoped fixture: `build` enqueues the cases (autocommit, TASKS of config.py),
    one burst worker (`args`: more runworker options) runs them, `during` runs while it
    works. Its tests must be non-transactional (`django_db`): pytest-django runs those before
    any transactional test, whose flush would delete the batch's rows. The rows are deleted
    when the module is done, so no other test sees them."""

    @pytest.fixture(scope="module")
    def fixture(
        django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[Batch]:
        batch = Batch()
        try:
            with django_db_blocker.unblock(), override_settings(TASKS=config.TASKS):
                build(batch)
                batch.records, batch.worker_log = run_worker(
                    tmp_path_factory.mktemp("batch"),
                    "batch",
                    *args,
                    during=(lambda: during(batch)) if during is not None else None,
                )
            yield batch
        finally:
            with django_db_blocker.unblock():
                ids = [case.enqueued.id for case in batch.cases.values()]
                WorkflowRun.objects.filter(pk__in=ids).delete()
                SideEffect.objects.filter(key__startswith=BATCH_PREFIX).delete()

    return fixture


BATCH_PREFIX = "batch:"  # SideEffect keys a batch's tasks write, deleted with it
