"""Statements per step and per run, counted with CaptureQueriesContext (a regression guard).

On PostgreSQL a finished step's checkpoint rides on the run's next statement (the next step's
start, or the run's completion), so a step costs one statement; SQLite, which has no
data-modifying CTEs, sends it on its own.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine import executor, transitions

pytestmark = pytest.mark.django_db


def per_step() -> int:
    return 1 if connection.vendor == "postgresql" else 2


def statements(captured: CaptureQueriesContext) -> int:
    """Statements sent, not counting transaction control (SQLite's claim takes the write lock
    with BEGIN IMMEDIATE before it computes the lease expiry)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")
    return sum(1 for q in captured.captured_queries if not q["sql"].startswith(control))


def run_once(task: str) -> tuple[int, int, str]:
    """(claim statements, execution statements, outcome) of one pass of the next run."""
    with CaptureQueriesContext(connection) as claim_q:
        [claimed] = transitions.claim_runs("w", [(task, 1)], None, 1, 30)
    with CaptureQueriesContext(connection) as exec_q:
        wf, ctx = executor.build_context(claimed.run, claimed.lease, threading.Event())
        outcome = executor.execute(claimed.run, wf, ctx)
    return statements(claim_q), len(exec_q), outcome


def test_one_claim_statement_and_one_statement_per_step() -> None:
    tasks_engine.enqueue("three_steps", {"n": 1})
    claim, execution, outcome = run_once("three_steps")
    assert outcome == "completed"
    assert claim == 1  # one UPDATE ... RETURNING, no second read of the run
    # 3 steps + the run's completion; each step of this workflow also writes one row of its own.
    assert execution == 3 * per_step() + 1 + 3


def test_a_single_step_run_costs_two_statements_after_its_claim() -> None:
    tasks_engine.enqueue("bench_noop")
    claim, execution, outcome = run_once("bench_noop")
    assert (claim, outcome) == (1, "completed")
    assert execution == per_step() + 1


def test_a_ten_step_run() -> None:
    tasks_engine.enqueue("bench_ten_steps")
    _, execution, outcome = run_once("bench_ten_steps")
    assert (outcome, execution) == ("completed", 10 * per_step() + 1)


def test_replayed_steps_cost_nothing_but_the_history_read(fake_clock) -> None:
    tasks_engine.enqueue("sleeper", {"seconds": 10})
    _, first, outcome = run_once("sleeper")
    # before: start + its own effect row (+ its completion on SQLite); nap: arm + park
    assert (outcome, first) == ("suspended", per_step() + 1 + 2)
    fake_clock.advance(11)
    _, second, outcome = run_once("sleeper")
    # close interrupted attempts + read history (replayed "before" costs nothing), finish
    # the nap, then "after" and the completion.
    assert (outcome, second) == ("completed", 2 + 1 + per_step() + 1 + 1)
