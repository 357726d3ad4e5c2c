"""Statements per step and per run, counted with CaptureQueriesContext (a regression guard).

On PostgreSQL a finished step's checkpoint rides on the run's next statement (the next step's
start, or the run's completion), so a step costs one statement; SQLite, which has no
data-modifying CTEs, sends it on its own.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine import transitions
from tasks_engine.db import partitions
from tasks_engine.models import StepAttempt
from tasks_engine.runtime import executor
from tasks_engine.transitions import claim_floor, queue_state

pytestmark = pytest.mark.django_db


def per_step() -> int:
    return 1 if connection.vendor == "postgresql" else 2


def statements(captured: CaptureQueriesContext) -> int:
    """Statements sent, not counting transaction control (SQLite's claim takes the write lock
    with BEGIN IMMEDIATE before it computes the lease expiry)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT")
    return sum(1 for q in captured.captured_queries if not q["sql"].startswith(control))


def run_once(task: str) -> tuple[int, int, str]:
    """(claim statements, execution statements, outcome) of one pass of the next run. The
    queue snapshot (paused queues, limit overrides) is read before: once per half poll
    interval, not per claim (transitions/queue_state.py); and so is the claim floor on
    partitioned tables, computed at most every claim_floor.REFRESH_SECONDS."""
    queue_state.current()
    claim_floor.floor()
    with CaptureQueriesContext(connection) as claim_q:
        [claimed] = transitions.claim_runs("w", [(task, 1)], None, 1, 30)
    with CaptureQueriesContext(connection) as exec_q:
        wf, ctx = executor.build_context(
            claimed.run, claimed.lease, threading.Event(), claimed.prestarted
        )
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


def test_a_lone_start_and_a_lone_completion_are_one_statement_each() -> None:
    """Outside a group (in-process, or group commit off) a start, and a completion carrying
    the last step's checkpoint, are one statement each; on PostgreSQL with their columns bound
    as parameters (transitions/hot_sql.py), not through a group's JSON rows."""
    run_id = tasks_engine.enqueue("bench_noop").run_id
    [claimed] = transitions.claim_runs("w", [("bench_noop", 1)], None, 1, 30)
    with CaptureQueriesContext(connection) as started:
        step_id = transitions.start_step(claimed.lease, "noop", "function", 1, 1)
    transitions.defer_step_completion(claimed.lease, step_id, {"n": 1})
    with CaptureQueriesContext(connection) as completed:
        transitions.complete_run(claimed.lease, {"done": True}, [])
    assert (statements(started), statements(completed)) == (1, per_step())
    if connection.vendor == "postgresql":
        sent = [q["sql"] for q in [*started.captured_queries, *completed.captured_queries]]
        assert not any("json_to_recordset" in sql for sql in sent)
    run = tasks_engine.get_run(run_id)
    assert (run.status, run.output) == ("completed", {"done": True})
    assert [(s.status, s.output) for s in run.steps] == [("completed", {"n": 1})]


def test_a_lone_write_carrying_several_checkpoints_writes_them_all() -> None:
    """More than one deferred completion (a failed send left one queued): a write alone
    carries them as rows, in its one statement."""
    tasks_engine.enqueue("bench_noop")
    [claimed] = transitions.claim_runs("w", [("bench_noop", 1)], None, 1, 30)
    lease = claimed.lease
    first = transitions.start_step(lease, "a", "function", 1, 1)
    second = transitions.start_step(lease, "b", "function", 1, 1)
    transitions.defer_step_completion(lease, first, 1)
    transitions.defer_step_completion(lease, second, 2)
    with CaptureQueriesContext(connection) as q:
        transitions.start_step(lease, "c", "function", 1, 1)
    assert statements(q) == (1 if connection.vendor == "postgresql" else 3)
    assert lease.deferred.pending() == ()
    outputs = dict(StepAttempt.objects.filter(run_id=lease.run_id).values_list("name", "output"))
    assert outputs == {"a": 1, "b": 2, "c": None}


def test_psycopg_keeps_the_conversion_of_the_longest_statements(settings: Any) -> None:
    """psycopg converts a statement's %s placeholders once and keeps the result only up to
    MAX_CACHED_STATEMENT_LENGTH characters (4096 by default); the engine raises it above its
    longest statements (the guarded claim's, a group's with every part and the claim), so none
    is converted again at each execution."""
    if connection.vendor != "postgresql":
        pytest.skip("psycopg")
    from psycopg import _queries

    from tasks_engine.transitions import claim_mode, first_steps, flow_claims_pg, hot_sql
    from tasks_engine.transitions.claims import _filters, claim_ctes

    connection.ensure_connection()
    first_steps.learn("noop", 1, "only")
    req = transitions.ClaimRequest("w", [("noop", 1)], None, 16, 30)
    claim, _params, _ = claim_ctes(req, tasks_engine.clock.now(), exclude=[])
    group = hot_sql.group_statement(("deferred", "starts", "completes"), True, claim, True)
    partitioned = partitions.unit() is not None  # TASKS_PARTITION: the floor's conditions too
    guarded = flow_claims_pg._statements(
        _filters(req.pairs, None)[0], 1, True, True, partitioned=partitioned
    )
    longest = max(len(group), *map(len, guarded))
    assert 4096 < longest <= _queries.MAX_CACHED_STATEMENT_LENGTH, longest
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"default": {"concurrency": 5, "rate_limit": "100/s"}},
    }
    claim_mode.note_keyed()
    try:
        tasks_engine.enqueue("noop", {"n": 1})
        transitions.claim_runs("w", [("noop", 1)], None, 1, 30)  # converted here
        before = _queries._query2pg.cache_info()
        transitions.claim_runs("w", [("noop", 1)], None, 1, 30)
        after = _queries._query2pg.cache_info()
    finally:
        claim_mode.forget_keyed()
    # The locking statement and the claim statement (the planner settings have no parameters;
    # on partitioned tables they carry the claim floor).
    assert (after.hits - before.hits, after.misses - before.misses) == (2 + partitioned, 0)
