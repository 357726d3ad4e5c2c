"""PostgreSQL restarted or stopped under running workers: every run completes, workers survive
and log the outage once per thread, not in a tight loop."""

from __future__ import annotations

import time

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.process

RUN = "tasks_engine_workflowrun"


def all_done(db, ids: list[str]) -> bool:
    rows = db.query(f"SELECT status FROM {RUN} WHERE id = ANY(%s::uuid[])", ids)
    return len(rows) == len(ids) and all(r[0] == "completed" for r in rows)


def outage_lines(db, tag: str) -> int:
    return db.log(tag).count("database unavailable")


def start_mix(db) -> list[str]:
    """Runs in every state an outage can hit: sleeping, mid-step, and queued behind them."""
    ids = [db.enqueue("sleeper", '{"seconds": 3}') for _ in range(3)]
    ids += [db.enqueue("slow_middle", '{"seconds": 2}') for _ in range(3)]
    return ids


@pytest.mark.parametrize("phase", ["sleeping-and-running", "idle"])
def test_postgres_restart(fault_db, phase: str) -> None:
    w = fault_db.worker(
        "--lease-seconds", "3", "--poll-interval", "0.2", "--concurrency", "4", tag="w"
    )
    ids: list[str] = []
    if phase == "idle":
        wait_for(lambda: "listening for wake-ups" in fault_db.log("w"), 30, "worker idle")
    else:
        ids = start_mix(fault_db)
        wait_for(
            lambda: (
                fault_db.scalar(
                    "SELECT count(*) FROM testapp_sideeffect WHERE key = 'middle-start'"
                )
                >= 1
            ),
            30,
            "steps to be running",
        )
    fault_db.cluster.restart()
    fault_db.cluster.wait_ready()
    ids += [fault_db.enqueue("noop", '{"n": 1}')]
    wait_for(lambda: all_done(fault_db, ids), 90, "every run to complete after the restart")
    assert w.poll() is None, fault_db.log("w")
    assert outage_lines(fault_db, "w") <= 8, fault_db.log("w")


def test_postgres_stopped_for_20_seconds(fault_db) -> None:
    w = fault_db.worker(
        "--lease-seconds", "3", "--poll-interval", "0.2", "--concurrency", "4", tag="w"
    )
    ids = start_mix(fault_db)
    wait_for(
        lambda: (
            fault_db.scalar("SELECT count(*) FROM testapp_sideeffect WHERE key = 'middle-start'")
            >= 1
        ),
        30,
        "steps to be running",
    )
    fault_db.cluster.stop()
    time.sleep(20)
    assert w.poll() is None, fault_db.log("w")
    fault_db.cluster.start()
    fault_db.cluster.wait_ready()
    wait_for(lambda: all_done(fault_db, ids), 90, "every run to complete after the outage")
    assert w.poll() is None
    lines = outage_lines(fault_db, "w")
    assert 1 <= lines <= 8, fault_db.log("w")


def leader_lines(db, tag: str, message: str) -> int:
    return sum(1 for line in db.log(tag).splitlines() if message in line and "leader" in line)


@pytest.mark.postgres_only("stops a throwaway PostgreSQL cluster under a worker")
def test_the_leader_logs_an_outage_once_while_the_database_stays_down(fault_db) -> None:
    """Alerting reads these lines: while the database is down, the leader thread says so once
    and never claims it is reachable again until a statement really went through. (A candidate
    that does not lead, here a worker started during the outage, used to count a round in
    which its election was not yet due, so made no statement, as a success.)"""
    fault_db.cluster.stop()
    try:
        w = fault_db.worker("--poll-interval", "0.2", tag="w")
        wait_for(lambda: leader_lines(fault_db, "w", "database unavailable") >= 1, 30, "the outage")
        time.sleep(4)  # four election periods of a 5 s leader lease
        assert w.poll() is None, fault_db.log("w")
        assert leader_lines(fault_db, "w", "database reachable again") == 0, fault_db.log("w")
        assert leader_lines(fault_db, "w", "database unavailable") == 1, fault_db.log("w")
    finally:
        fault_db.cluster.start()
        fault_db.cluster.wait_ready()
    wait_for(
        lambda: leader_lines(fault_db, "w", "database reachable again") == 1, 30, "the recovery"
    )
