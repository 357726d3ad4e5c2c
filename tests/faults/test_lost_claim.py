"""A claim the database loses in a crash. The claim loop commits without waiting for the WAL
flush (worker/loop.py `_configure_connection`), so a crash can take back a claim whose run
already started its step. The run must then be claimed again and complete with one checkpoint
of its step, and the worker that ran it first must commit nothing under its lost lease.

The loss is made certain, not hoped for: the WAL writer is stopped (SIGSTOP) before the
enqueue, so nothing writes the claim's WAL out in the background, and killed (SIGKILL) once
the step runs: PostgreSQL treats a dead child as a crash, and reinitialises its shared memory
(the WAL buffers with it) before it recovers from the WAL on disk. A synchronous commit of the
worker's between the claim and the kill (its heartbeat, its leader) would write the claim out
with its own; so would the background writer writing the run's page out, or a checkpoint: the
test's cluster is its own, with neither (nor autovacuum). The worker row's beat comes every 2 s
and a step's start wakes it when it is due: the enqueue follows a beat at once, so that the
claim, the step's start and the crash all fall before the next. Should a write still flush the
claim, the test tries again with a new run, up to eight times."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.faults.conftest import FaultDb
from tests.helpers import wait_for
from tests.pgcluster import Cluster
from tests.testapp.process_workflows import trace_lines


def _walwriter(db) -> int:
    return int(db.scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"))


def _crash_while_the_step_runs(db, trace: Path) -> tuple[str, str]:
    """Enqueue with the WAL writer stopped, crash the database once the step has started; the
    run's id and its status after the recovery."""
    walwriter = _walwriter(db)
    os.kill(walwriter, signal.SIGSTOP)
    try:
        rid = db.manage("shell", "-c", ENQUEUE_AFTER_A_BEAT % str(trace)).split()[-1]
        wait_for(lambda: trace_lines(trace), 30, "the step to start")
    finally:
        os.kill(walwriter, signal.SIGKILL)  # a crash: the postmaster restarts every process
    db.cluster.wait_ready()
    wait_for(lambda: _walwriter_is_back(db, walwriter), 30, "the database to recover")
    return rid, str(db.scalar("SELECT status FROM tasks_engine_workflowrun WHERE id = %s", rid))


def _walwriter_is_back(db, old: int) -> bool:
    try:
        return _walwriter(db) != old
    except (IndexError, TypeError, RuntimeError):
        return False


# Enqueued by a process of the fault database's own, the moment the worker row's beat lands.
ENQUEUE_AFTER_A_BEAT = """
import time
from tasks_engine import enqueue
from tasks_engine.models import Worker
beat = Worker.objects.get().last_heartbeat
while Worker.objects.get().last_heartbeat == beat:
    time.sleep(0.005)
print(enqueue("outage_step", {"trace": %r, "seconds": 3}).run_id)
"""

# Nothing but the worker's own commits writes the WAL out.
QUIET = {
    "bgwriter_lru_maxpages": "0",
    "checkpoint_timeout": "'1h'",
    "max_wal_size": "'4GB'",
    "autovacuum": "off",
}


@pytest.fixture
def fault_db(tmp_path: Path) -> Iterator[FaultDb]:
    cluster = Cluster(fsync=False, settings=QUIET).init()
    cluster.start()
    db = FaultDb(cluster, tmp_path)
    try:
        yield db
    finally:
        db.close()
        cluster.destroy()


def test_a_claim_lost_in_a_crash_is_claimed_again_and_its_first_worker_commits_nothing(
    fault_db, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TEST_LEADER_LEASE_SECONDS", "60")  # renewed every 20 s, not 1.7 s
    w = fault_db.worker(
        "--task", "outage_step@1", "--concurrency", "2", "--lease-seconds", "60",
        "--poll-interval", "0.2", tag="w",
    )  # fmt: skip
    wait_for(lambda: "listening for wake-ups" in fault_db.log("w"), 30, "worker idle")
    wait_for(lambda: "elected maintenance leader" in fault_db.log("w"), 30, "its election written")
    # A first run teaches the worker the workflow's first step, so that its claims start that
    # step themselves (transitions/first_steps.py): no write of the slot's follows the claim.
    warm = fault_db.enqueue(
        "outage_step", json.dumps({"trace": str(tmp_path / "warm"), "seconds": 0})
    )
    wait_for(lambda: _completed(fault_db, warm), 30, "a first run")
    for attempt in range(8):
        trace = tmp_path / f"trace-{attempt}.jsonl"
        rid, status = _crash_while_the_step_runs(fault_db, trace)
        if status == "pending":
            break  # the claim was lost: its step runs on a worker that holds no lease
        wait_for(partial(_completed, fault_db, rid), 90, "the run flushed by chance")
        # The worker's threads reconnect and write (the leader's, its row's) after the run
        # completes; without this settle, 2 of 5 runs here needed 5 tries or more than 8.
        time.sleep(3)
    assert status == "pending", "a write of the worker's flushed the claim eight times"
    wait_for(lambda: _completed(fault_db, rid), 90, "the run to be claimed again and complete")
    starts = [r for r in trace_lines(trace) if r["event"] == "start"]
    assert len(starts) == 2  # the lost claim's run of the step, and the new claim's
    assert _attempts(fault_db, rid) == [("completed", 1)]
    refused = f"run {rid}: lease lost"  # the first run of the step's completion, fenced out
    wait_for(lambda: refused in fault_db.log("w"), 30, "the lost claim's completion refused")
    assert _attempts(fault_db, rid) == [("completed", 1)]
    assert w.poll() is None, fault_db.log("w")


def _attempts(db, rid: str) -> list[tuple]:
    return db.query(
        "SELECT status, count(*) FROM tasks_engine_stepattempt WHERE run_id = %s GROUP BY 1",
        rid,
    )


def _completed(db, rid: str) -> bool:
    return (
        db.scalar("SELECT status FROM tasks_engine_workflowrun WHERE id = %s", rid) == "completed"
    )
