"""Statements per step and per run, counted with CaptureQueriesContext (a regression guard)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine import executor, transitions

pytestmark = pytest.mark.django_db


def run_once(task: str) -> tuple[int, int, str]:
    """(claim statements, execution statements, outcome) of one pass of the next run."""
    with CaptureQueriesContext(connection) as claim_q:
        [claimed] = transitions.claim_runs("w", [(task, 1)], None, 1, 30)
    with CaptureQueriesContext(connection) as exec_q:
        wf, ctx = executor.build_context(claimed.run, claimed.lease, threading.Event())
        outcome = executor.execute(claimed.run, wf, ctx)
    return len(claim_q), len(exec_q), outcome


def test_one_claim_statement_and_two_statements_per_step() -> None:
    tasks_engine.enqueue("three_steps", {"n": 1})
    claim, execution, outcome = run_once("three_steps")
    assert outcome == "completed"
    assert claim == 1  # one UPDATE ... RETURNING, no second read of the run
    # 3 steps x (fenced INSERT of the attempt + fenced UPDATE completing it) + 1 completion.
    # Each side-effect step of the test workflow also writes one row of its own (3 more).
    assert execution == 3 * 2 + 1 + 3


def test_a_no_op_run_costs_three_statements() -> None:
    tasks_engine.enqueue("b")
    claim, execution, outcome = run_once("b")
    assert (claim, execution, outcome) == (1, 1, "completed")


def test_replayed_steps_cost_nothing_but_the_history_read(fake_clock) -> None:
    tasks_engine.enqueue("sleeper", {"seconds": 10})
    _, first, outcome = run_once("sleeper")
    # before: attempt INSERT + its own effect row + completion; nap: arm + park
    assert (outcome, first) == ("suspended", 3 + 2)
    fake_clock.advance(11)
    _, second, outcome = run_once("sleeper")
    # close interrupted attempts + read history (replayed "before" costs nothing), finish
    # the nap, then "after" (3) and the completion.
    assert (outcome, second) == ("completed", 2 + 1 + 3 + 1)
