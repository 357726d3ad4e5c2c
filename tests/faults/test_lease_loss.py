"""A worker that cannot renew its lease for longer than the lease must stop the step through
`ctx.abort_signal` (reason: LeaseLostError) instead of running on: once the lease has expired,
another worker may hold the run, and two attempts would run the same step at once. When the
database is back, the run is reclaimed and completes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.testapp.process_workflows import trace_lines

pytestmark = pytest.mark.process

RUN = "tasks_engine_workflowrun"
LEASE = 3.0  # a heartbeat every second
OUTAGE = 8.0  # the most the step may take to abort: longer than the lease and a heartbeat


def until_aborted_or_outage_over(trace: Path, outage_ends: float) -> None:
    """The database stays down until the step aborts, or until `outage_ends` (a time.time())
    if it never does; no error here, so that the cluster is started again before the test
    says what went wrong."""
    while time.time() < outage_ends:
        if any(r["event"] == "aborted" for r in trace_lines(trace)):
            return
        time.sleep(0.05)


def test_a_worker_that_cannot_renew_its_lease_aborts_the_step(fault_db) -> None:
    trace = fault_db.tmp / "watch.jsonl"
    run_id = fault_db.enqueue("lease_watch", json.dumps({"trace": str(trace), "seconds": 60}))
    fault_db.worker("--lease-seconds", str(LEASE), "--poll-interval", "0.2", tag="w")
    wait_for(lambda: trace_lines(trace), 30, "the step to start")
    time.sleep(LEASE)  # a few renewals go through first
    stopping = time.time()
    fault_db.cluster.stop()
    until_aborted_or_outage_over(trace, stopping + OUTAGE)
    # Still down: whatever the step recorded so far, it recorded without the database.
    events = trace_lines(trace)
    restarted = time.time()
    fault_db.cluster.start()
    fault_db.cluster.wait_ready()
    aborted = [r for r in events if r["event"] == "aborted"]
    assert aborted, f"the step ran on without its lease: {events}\n{fault_db.log('w')}"
    assert aborted[0]["reason"] == "LeaseLostError", aborted
    # The last renewal was before the stop: the abort came within the lease (plus a heartbeat
    # and some slack), and in any case before the database was back.
    assert stopping < aborted[0]["at"] < restarted, (stopping, aborted, restarted)
    wait_for(
        lambda: (
            fault_db.scalar(f"SELECT status FROM {RUN} WHERE id = %s", run_id)
            in {"completed", "failed", "canceled"}
        ),
        60,
        "the run to end after the outage",
    )
    assert fault_db.scalar(f"SELECT status FROM {RUN} WHERE id = %s", run_id) == "completed", (
        fault_db.log("w")
    )
    steps = fault_db.query(
        "SELECT attempt, status FROM tasks_engine_stepattempt"
        " WHERE run_id = %s AND name = 'watch' ORDER BY attempt",
        run_id,
    )
    assert steps == [(1, "abandoned"), (2, "completed")], steps
    assert [r["event"] for r in trace_lines(trace)] == ["start", "aborted", "start", "finished"]
