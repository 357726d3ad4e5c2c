"""The worker's side loops (heartbeat, leader, listener, group writer) are watched: when one
dies, the worker stops and hands its runs back. A real worker (its claim loop, slot threads and
side loops) runs in a thread of the test process; each test makes one side loop raise."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

import tasks_engine
from tasks_engine.db.notify import Listener
from tasks_engine.definitions import registry
from tasks_engine.models import WorkflowRun
from tasks_engine.services.leader import Leader
from tasks_engine.worker.group_commit import GroupCommit
from tasks_engine.worker.heartbeat import Heartbeat
from tasks_engine.worker.loop import Worker, WorkerConfig
from tests.helpers import wait_for
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)

kill = threading.Event()


def _raise_once_killed(real: Any) -> Any:
    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, *args, **kwargs)
        if kill.is_set():
            raise RuntimeError("bug in a side loop")
        return result

    return broken


def _listen_until_killed(self: Listener, conn: Any) -> None:
    kill.wait(60)
    raise RuntimeError("bug in the listener")


BREAK = {
    "heartbeat": (Heartbeat, "flush_progress", _raise_once_killed(Heartbeat.flush_progress)),
    "leader": (Leader, "round", _raise_once_killed(Leader.round)),
    "listener": (Listener, "_listen", _listen_until_killed),
    "group writer": (GroupCommit, "_gather", _raise_once_killed(GroupCommit._gather)),
}
POSTGRES_ONLY = {"listener", "group writer"}


@pytest.fixture
def worker() -> Iterator[Worker]:
    kill.clear()
    config = WorkerConfig(
        workflows=(registry.get("abortable"), registry.get("bench_noop")),
        concurrency=2,
        heartbeat_seconds=0.2,
        poll_interval=0.1,
        grace_seconds=0.5,
    )
    w = Worker(config)
    yield w
    kill.set()
    w.request_stop()
    connection_created.disconnect(w._configure_connection)


@pytest.mark.parametrize("loop", sorted(BREAK))
def test_a_dead_side_loop_stops_the_worker_and_hands_its_runs_back(
    monkeypatch: pytest.MonkeyPatch, worker: Worker, loop: str
) -> None:
    if loop in POSTGRES_ONLY and connection.vendor != "postgresql":
        pytest.skip(f"no {loop} on SQLite")
    cls, name, broken = BREAK[loop]
    monkeypatch.setattr(cls, name, broken)
    rid = tasks_engine.enqueue("abortable").run_id
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(worker.run()), daemon=True)
    thread.start()
    wait_for(lambda: SideEffect.objects.filter(key="loop-start", run_id=rid).exists(), 30)
    kill.set()
    if loop == "group writer":
        tasks_engine.enqueue("bench_noop")  # a write for the writer to die on
    thread.join(60)
    assert not thread.is_alive() and exit_codes == [0]
    run = WorkflowRun.objects.get(pk=rid)
    assert (run.status, run.lease_token) == ("pending", None)  # handed back, replayed at once
    assert not WorkflowRun.objects.filter(status="running").exists()
