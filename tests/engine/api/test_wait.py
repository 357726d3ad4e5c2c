"""tasks_engine.wait(): blocks until the run has finished; TimeoutError; UnknownRunError.
On PostgreSQL a run someone waits on NOTIFYs its end; a run nobody waits on sends nothing."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

import tasks_engine
from tasks_engine import UnknownRunError
from tasks_engine.db import notify
from tasks_engine.models import WorkflowRun
from tasks_engine.transitions.awaiting import RUN_END_CHANNEL
from tests.helpers import drain, wait_for
from tests.testapp.models import Marker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_finished_run_is_returned_at_once() -> None:
    run_id = tasks_engine.enqueue("noop", {"n": 1}).run_id
    drain()
    view = tasks_engine.wait(run_id, timeout=0)
    assert (view.run_id, view.status) == (run_id, "completed")
    assert view.steps  # the full view, as get_run gives it


def test_unknown_run() -> None:
    with pytest.raises(UnknownRunError):
        tasks_engine.wait(uuid.uuid4(), timeout=1)
    with pytest.raises(UnknownRunError):
        tasks_engine.wait("nope")


def test_timeout_on_an_unfinished_run() -> None:
    run_id = tasks_engine.enqueue("fact_waiter", {}).run_id
    with pytest.raises(TimeoutError, match=str(run_id)):
        tasks_engine.wait(run_id, timeout=0.2)
    with pytest.raises(TimeoutError, match=str(run_id)):
        tasks_engine.wait(run_id, timeout=timedelta(seconds=0.2))  # as a step's timeout= takes
    assert WorkflowRun.objects.get(pk=run_id).status == "pending"


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True, timedelta(seconds=-1)])
def test_a_bad_timeout_is_refused(bad: object) -> None:
    run_id = tasks_engine.enqueue("noop", {}).run_id
    with pytest.raises(ValueError, match="timeout"):
        tasks_engine.wait(run_id, timeout=bad)  # type: ignore[arg-type]


def test_wait_returns_once_another_thread_ends_the_run() -> None:
    Marker.objects.create(key="t:open")
    run_id = tasks_engine.enqueue("gated", {"key": "t", "wait_fact": True}).run_id
    drain()
    assert WorkflowRun.objects.get(pk=run_id).status == "waiting"

    def finish() -> None:
        try:
            wait_for(lambda: WorkflowRun.objects.get(pk=run_id).awaited or not notify.enabled())
            time.sleep(0.2)
            tasks_engine.signal(run_id, "go", "now")
            drain()
        finally:
            connection.close()

    t = threading.Thread(target=finish)
    t.start()
    view = tasks_engine.wait(run_id, timeout=60)
    t.join()
    assert (view.status, view.output) == ("completed", {"done": ["a", "now", "b", "c"]})


@pytest.mark.postgres_only("NOTIFY")
def test_only_a_run_someone_waits_on_notifies_its_end() -> None:
    awaited = tasks_engine.enqueue("noop", {"n": 1}).run_id
    unwatched = tasks_engine.enqueue("noop", {"n": 2}).run_id
    with psycopg.connect(**notify.listen_params(), autocommit=True) as conn:
        conn.execute(f"LISTEN {RUN_END_CHANNEL}")
        WorkflowRun.objects.filter(pk=awaited).update(awaited=True)
        drain()
        heard = [n.payload for n in conn.notifies(timeout=2.0, stop_after=2)]
    assert heard == [str(awaited)]
    assert str(unwatched) not in heard
