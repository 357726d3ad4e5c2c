"""Atomic steps longer than the lease, under real `runworker` processes, on PostgreSQL and
SQLite.

PostgreSQL: the worker's sessions end a transaction left idle for twice the lease (10 s at
least); an atomic step keeps its transaction open while its code runs, and was cut off that
way every time it ran: the commit failed as an outage, the same worker reclaimed the run
without counting the attempt, and the step started again, for ever. Its transaction is now
kept alive while it runs, and the step completes.

SQLite: an atomic step holds the database's only write lock, and every other worker's lease
renewal waits for it; a bound above half the worker's lease (`--lease-seconds`) let a healthy
run on another worker lapse and run twice. The bound now follows the worker's lease.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.models import SideEffect
from tests.testapp.process_workflows import trace_lines

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # SQLite: the atomic-step bound, the one write lock
]

LEASE = "2"  # seconds: PostgreSQL's idle-in-transaction bound is then its floor, 10 s
FAST = ("--lease-seconds", LEASE, "--poll-interval", "0.2")


def finished(run_id) -> bool:
    return WorkflowRun.objects.get(pk=run_id).status in {"completed", "failed", "canceled"}


def starts(trace: Path) -> int:
    return sum(1 for r in trace_lines(trace) if r["event"] == "start")


def attempts(run_id) -> list[tuple[int, str]]:
    steps = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    return list(steps.values_list("attempt", "status"))


def test_an_atomic_step_longer_than_the_lease_ends(workers, tmp_path: Path) -> None:
    """PostgreSQL: an 11 s atomic step (past the 10 s idle bound of a 2 s lease) completes,
    once. SQLite: the bound, a third of the 2 s lease, cuts it short; the step's retry policy
    (one attempt) fails the run, and its write is rolled back."""
    on_postgres = connection.vendor == "postgresql"
    trace = tmp_path / "atomic.jsonl"
    seconds = 11 if on_postgres else 3
    res = tasks_engine.enqueue("long_atomic", {"trace": str(trace), "seconds": seconds})
    w = workers(*FAST)
    # On the old code the run never ended on PostgreSQL: a new attempt every ~10.5 s.
    wait_for(lambda: finished(res.run_id), seconds + 15, "the run to end")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert starts(trace) == 1, w.log()
    if on_postgres:
        assert run.status == "completed", w.log()
        assert attempts(res.run_id) == [(1, "completed")]
        assert SideEffect.objects.filter(key="long-atomic").count() == 1
    else:
        assert run.status == "failed", w.log()
        assert "AtomicStepTimeoutError" in str(run.error), run.error
        assert attempts(res.run_id) == [(1, "failed")]
        assert SideEffect.objects.filter(key="long-atomic").count() == 0


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


@pytest.mark.postgres_only("the server's idle-in-transaction bound is PostgreSQL's")
def test_a_frozen_worker_still_loses_its_atomic_transaction(workers, tmp_path: Path) -> None:
    """The keep-alive comes from the worker's own process: a frozen worker sends none, and the
    server still ends the transaction it left open (its row locks go with it)."""
    trace = tmp_path / "atomic.jsonl"
    tasks_engine.enqueue("long_atomic", {"trace": str(trace), "seconds": 60})
    w = workers(*FAST)
    wait_for(lambda: starts(trace) == 1, 30, "the atomic step to start")
    wait_for(lambda: idle_in_transaction() == 1, 10, "the step's transaction to sit idle")
    w.send(signal.SIGSTOP)
    # The bound of a 2 s lease is 10 s; the keep-alive had reset it at most a second ago.
    wait_for(lambda: idle_in_transaction() == 0, 15, "the server to end the transaction")


def idle_in_transaction() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'"
        )
        return cur.fetchone()[0]


def test_a_fenced_commit_inside_an_atomic_step_costs_no_other_run_its_lease(
    workers, tmp_path: Path
) -> None:
    """A fenced commit locks its run's row until the atomic step around it commits; the
    worker's one renewal statement for all its runs must not wait for that lock, or every other
    run the worker holds lapses meanwhile and runs again elsewhere."""
    healthy_trace, atomic_trace = tmp_path / "healthy.jsonl", tmp_path / "atomic.jsonl"
    w = workers(*FAST, tag="holder")
    healthy = tasks_engine.enqueue("outage_step", {"trace": str(healthy_trace), "seconds": 6})
    wait_for(lambda: starts(healthy_trace) == 1, 30, "the healthy step to start")
    fenced = tasks_engine.enqueue("fenced_in_atomic", {"trace": str(atomic_trace), "seconds": 4})
    wait_for(lambda: starts(atomic_trace) == 1, 30, "the atomic step to start")
    other = workers(*FAST, "--task", "outage_step@1", tag="other")
    wait_for(lambda: finished(healthy.run_id) and finished(fenced.run_id), 40, "both runs")
    assert starts(healthy_trace) == 1, w.log() + other.log()
    assert "lease lost" not in w.log()  # the locked run's lease was held, not lost
    assert WorkflowRun.objects.get(pk=healthy.run_id).status == "completed", w.log()
    expected = "completed" if connection.vendor == "postgresql" else "failed"  # SQLite: cut
    assert WorkflowRun.objects.get(pk=fenced.run_id).status == expected, w.log()


@pytest.mark.postgres_only("a frozen worker keeps SQLite's only write lock (docs/SQLITE.md)")
def test_an_atomic_step_whose_lease_another_worker_takes_counts(workers, tmp_path: Path) -> None:
    """If the lease is lost anyway (its worker froze), the attempt counts against the step's
    retries when another worker takes the run: one attempt allowed, so the run fails instead
    of starting the step again."""
    trace = tmp_path / "atomic.jsonl"
    res = tasks_engine.enqueue("long_atomic", {"trace": str(trace), "seconds": 60})
    frozen = workers(*FAST, tag="frozen")
    wait_for(lambda: starts(trace) == 1, 30, "the atomic step to start")
    frozen.send(signal.SIGSTOP)
    other = workers(*FAST, tag="other")
    wait_for(lambda: finished(res.run_id), 30, "the other worker to end the run")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "failed", other.log()
    assert "interrupted 1 times" in run.error["message"], run.error
    assert starts(trace) == 1
    first = StepAttempt.objects.filter(run_id=res.run_id).order_by("id").first()
    assert (first.status, first.counted) == ("abandoned", True)
