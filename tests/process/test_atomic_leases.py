"""Atomic steps longer than the lease, under real `runworker` processes, on PostgreSQL and
SQLite.

SQLite: an atomic step holds the database's only write lock, and every other worker's lease
renewal waits for it; a bound above half the worker's lease (`--lease-seconds`) let a healthy
run on another worker lapse and run twice. The bound now follows the worker's lease.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.process_workflows import trace_lines

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

LEASE = "2"  # seconds: PostgreSQL's idle-in-transaction bound is then its floor, 10 s
FAST = ("--lease-seconds", LEASE, "--poll-interval", "0.2")


def finished(run_id) -> bool:
    return WorkflowRun.objects.get(pk=run_id).status in {"completed", "failed", "canceled"}


def starts(trace: Path) -> int:
    return sum(1 for r in trace_lines(trace) if r["event"] == "start")


def attempts(run_id) -> list[tuple[int, str]]:
    steps = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    return list(steps.values_list("attempt", "status"))


def test_a_long_atomic_step_costs_no_other_run_its_lease(workers, tmp_path: Path) -> None:
    """One worker runs a healthy 6 s step under a 2 s lease; another then runs an atomic step
    that would hold its transaction 4 s (SQLite: the write lock, which the healthy run's
    renewals wait for). The healthy step's body runs exactly once."""
    on_postgres = connection.vendor == "postgresql"
    healthy_trace, atomic_trace = tmp_path / "healthy.jsonl", tmp_path / "atomic.jsonl"
    healthy = tasks_engine.enqueue("outage_step", {"trace": str(healthy_trace), "seconds": 6})
    b = workers(*FAST, "--task", "outage_step@1", tag="healthy")
    wait_for(lambda: starts(healthy_trace) == 1, 30, "the healthy step to start")
    atomic = tasks_engine.enqueue("long_atomic", {"trace": str(atomic_trace), "seconds": 4})
    a = workers(*FAST, tag="atomic")  # serves both workflows: it takes over a lapsed lease
    wait_for(lambda: finished(healthy.run_id) and finished(atomic.run_id), 40, "both runs")
    assert starts(healthy_trace) == 1, b.log() + a.log()
    assert WorkflowRun.objects.get(pk=healthy.run_id).status == "completed", b.log()
    assert attempts(healthy.run_id) == [(1, "completed")]
    assert starts(atomic_trace) == 1
    expected = "completed" if on_postgres else "failed"  # SQLite: cut at a third of the lease
    assert WorkflowRun.objects.get(pk=atomic.run_id).status == expected, a.log()
