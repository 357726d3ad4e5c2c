"""A worker frozen inside a fenced side effect must not commit after it lost its lease."""

from __future__ import annotations

import signal

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.process

RUN = "tasks_engine_workflowrun"


def test_sigstopped_worker_cannot_commit_and_keeps_serving(fault_db) -> None:
    run_id = fault_db.enqueue("fenced_slow", '{"seconds": 3}')
    frozen = fault_db.worker("--lease-seconds", "2", "--poll-interval", "0.2", tag="frozen")
    wait_for(
        lambda: (
            fault_db.scalar("SELECT count(*) FROM testapp_sideeffect WHERE key = 'op-start'") == 1
        ),
        30,
        "op start",
    )
    frozen.send_signal(signal.SIGSTOP)
    try:
        fault_db.worker("--lease-seconds", "2", "--poll-interval", "0.2", tag="rescuer")
        wait_for(
            lambda: (
                fault_db.scalar(f"SELECT status FROM {RUN} WHERE id = %s", run_id) == "completed"
            ),
            60,
            "the rescuer to finish the run",
        )
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "dropping the run" in fault_db.log("frozen"),
        4,
        "the frozen worker to wake up, finish its op and have its commit refused",
    )
    markers = fault_db.query(
        "SELECT value FROM testapp_marker WHERE key LIKE %s", f"fenced:{run_id}:%"
    )
    assert markers == [("rescuer",)]
    assert (
        fault_db.scalar(
            "SELECT result->>'by' FROM tasks_engine_opledger WHERE op_key = %s", f"fenced:{run_id}"
        )
        == "rescuer"
    )
    assert (
        fault_db.scalar(
            "SELECT result->>'resumed' FROM tasks_engine_opledger WHERE op_key = %s",
            f"fenced:{run_id}",
        )
        == "true"
    )
    log = fault_db.log("frozen")
    assert "FencingError" in log or "lease lost" in log, log
    assert frozen.poll() is None  # it did not crash
    # ... and it goes on serving other runs.
    fault_db.procs[-1].send_signal(signal.SIGTERM)  # stop the rescuer
    fault_db.procs[-1].wait(30)
    other = fault_db.enqueue("b")
    wait_for(
        lambda: fault_db.scalar(f"SELECT status FROM {RUN} WHERE id = %s", other) == "completed",
        30,
        "the frozen worker to serve a new run",
    )
    assert fault_db.scalar(f"SELECT worker_id FROM {RUN} WHERE id = %s", other).split(":")[
        1
    ] == str(frozen.pid)
