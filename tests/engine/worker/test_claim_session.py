"""Which of a worker's sessions wait for the WAL flush at commit (PostgreSQL). The claim loop's
does not (loop.py `_configure_connection`: a lost claim leaves its run queued and its worker
fenced out); every session that writes a promise does: the slots' (steps, checkpoints), the
group writer's (completions), the heartbeat's and the leader's. A real worker runs in a thread
of the test process; each of its threads' sessions is asked for its setting."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

import tasks_engine
from tasks_engine.definitions import registry
from tasks_engine.worker.loop import Worker, WorkerConfig
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")


@pytest.fixture
def sessions() -> Iterator[dict[str, Any]]:
    """Each thread's latest raw connection, by thread name."""
    seen: dict[str, Any] = {}

    def record(sender: Any, connection: Any, **kwargs: Any) -> None:
        seen[threading.current_thread().name] = connection.connection

    connection_created.connect(record, weak=False)
    yield seen
    connection_created.disconnect(record)


def _setting(raw: Any) -> str:
    # psycopg connections are thread-safe: the worker's thread waits on its own lock meanwhile
    return str(raw.execute("SHOW synchronous_commit").fetchone()[0])


def test_only_the_claim_loop_commits_without_waiting_for_the_flush(
    sessions: dict[str, Any],
) -> None:
    worker = Worker(
        WorkerConfig(
            workflows=(registry.get("bench_noop"),),
            concurrency=2,
            heartbeat_seconds=0.2,
            poll_interval=0.1,
            grace_seconds=0.5,
        )
    )
    loop = threading.Thread(target=worker.run, name="claim-loop", daemon=True)
    loop.start()
    try:
        rid = tasks_engine.enqueue("bench_noop").run_id
        wait_for(lambda: tasks_engine.get_run(rid).status == "completed", 30)
        wait_for(lambda: "claim-loop" in sessions and len(sessions) >= 4, 10)
        settings = {name: _setting(raw) for name, raw in list(sessions.items())}
    finally:
        worker.request_stop()
        loop.join(30)
        connection_created.disconnect(worker._configure_connection)
    assert settings.pop("claim-loop") == "off"
    assert any(name.startswith("tasks-slot") for name in settings), settings
    assert set(settings.values()) == {"on"}, settings
