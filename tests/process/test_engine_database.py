"""The engine on a database of its own (TASKS_ENGINE["DATABASE"], here through UMT's
TASKS_DATABASE_URL) with real processes: a worker runs a workflow there, and an outbox relay
on the business database starts a run there exactly once although it is killed between the
two writes (the run, committed on the engine's database; the event's `dispatched`, in the
relay's transaction on "default")."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

import tasks_engine
from outbox import publish
from outbox.models import OutboxEvent
from tasks_engine.models import WorkflowRun
from tests import aliases
from tests.helpers import WorkerProcess, wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.both_dbs]


@pytest.fixture(params=["postgresql", "sqlite"])
def engine_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The engine on a fresh database (alias tasks_<vendor> here, "tasks" in the children)."""
    name = f"tasks_{request.param}"
    with aliases.engine_database(name, request.param, tmp_path / "engine.sqlite3") as url:
        yield url
        for alias in (name, "default"):
            connections[alias].close()


def test_a_worker_runs_a_workflow_on_the_engine_database(workers: Any, engine_url: str) -> None:
    run = tasks_engine.enqueue("repeat_names")
    w = workers("--burst", env={"TASKS_DATABASE_URL": engine_url})
    assert w.wait(60) == 0, w.log()
    assert tasks_engine.get_run(run.run_id).status == "completed"
    with connections["default"].cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {WorkflowRun._meta.db_table}")
        assert cur.fetchone()[0] == 0


@pytest.mark.parametrize("keyed", [True, False])
def test_a_relay_killed_between_the_run_and_the_event_starts_it_once(
    tmp_path: Path, engine_url: str, keyed: bool
) -> None:
    """Unkeyed (a route that does not pass `event.run_key`) starts it twice: the fault is real."""
    with transaction.atomic():
        event = publish("test.start_run_once", {"n": 1, "unkeyed": not keyed})
    marker = tmp_path / "stopped"
    env = {
        "TASKS_DATABASE_URL": engine_url,
        "OUTBOX_CLAIM_SECONDS": "1",
        "UMT_TEST_STOP_AT": "outbox-run-started",
        "UMT_TEST_STOP_MARKER": str(marker),
    }
    relays: list[WorkerProcess] = []
    try:
        doomed = WorkerProcess(["runrelay", "--poll-interval", "0.2"], tmp_path, "doomed", env)
        relays.append(doomed)
        wait_for(marker.exists, 60, "the relay to stop after starting the run")
        doomed.send(signal.SIGKILL)
        doomed.wait(10)
        runs = WorkflowRun.objects.filter(task_name="noop")
        assert runs.count() == 1  # committed on the engine's database
        assert OutboxEvent.objects.get(pk=event.pk).status == "pending"  # rolled back
        wait_for(
            lambda: OutboxEvent.objects.get(pk=event.pk).next_attempt_at <= timezone.now(),
            what="the killed relay's claim to run out",
        )
        env.pop("UMT_TEST_STOP_AT")
        rescuer = WorkerProcess(["runrelay", "--burst"], tmp_path, "rescuer", env)
        relays.append(rescuer)
        assert rescuer.wait(60) == 0, rescuer.log()
    finally:
        for r in relays:
            r.stop()
    assert OutboxEvent.objects.get(pk=event.pk).status == "dispatched"
    assert runs.count() == (1 if keyed else 2)
