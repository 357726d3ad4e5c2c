"""Group commit (PostgreSQL): several slots' writes, and the claim of their successors, in one
statement; each write keeps its own fence."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine import LeaseLostError, clock, transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.transitions import hot, hot_sql
from tasks_engine.worker.group_commit import GroupCommit
from tasks_engine.worker.slots import SlotPool
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

PAIRS = [("bench_noop", 1)]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("group commit needs data-modifying CTEs (PostgreSQL)")


def claim(n: int) -> list[transitions.Claimed]:
    return transitions.claim_runs("w", PAIRS, None, n, 30)


def start(c: transitions.Claimed, name: str = "noop") -> transitions.HotWrite:
    return transitions.HotWrite("start", c.lease, (), clock.now(), name, attempt=1, run_pass=1)


def complete(c: transitions.Claimed, deferred=()) -> transitions.HotWrite:
    write = transitions.HotWrite("complete", c.lease, deferred, clock.now())
    write.output = {"done": str(c.lease.run_id)}
    return write


def lock_loops(parts: tuple[hot_sql.Part, ...], writes: list[transitions.HotWrite]) -> list[int]:
    """EXPLAIN ANALYZE of the group statement of `parts` on `writes` (rolled back): the loops
    of each of its LockRows nodes (the fences' row locks)."""
    sql = hot_sql.group_statement(parts, True, None)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", hot._rows(writes))
        plan = json.dumps(cur.fetchone()[0])
        transaction.set_rollback(True)
    return [int(x) for x in re.findall(r'"Node Type": "LockRows"[^}]*?"Actual Loops": (\d+)', plan)]


def test_starts_completions_and_the_next_claim_share_one_statement() -> None:
    for _ in range(5):
        tasks_engine.enqueue("bench_noop")
    first = claim(2)
    starts = [start(c) for c in first]
    transitions.write_group(starts)
    assert all(isinstance(w.result, int) for w in starts)
    completes = [
        complete(c, (transitions.Completion(w.result, {"n": 1}, clock.now()),))
        for c, w in zip(first, starts, strict=True)
    ]
    request = transitions.ClaimRequest("w2", PAIRS, None, 2, 30)
    with CaptureQueriesContext(connection) as queries:
        claimed = transitions.write_group(completes, request)
    assert len(queries) == 1
    assert all(w.result == "completed" and w.error is None for w in completes)
    assert len(claimed) == 2
    assert {c.lease.run_id for c in claimed}.isdisjoint({c.lease.run_id for c in first})
    for c in first:
        run = WorkflowRun.objects.get(pk=c.lease.run_id)
        assert (run.status, run.output, run.lease_token) == (
            "completed",
            {"done": str(c.lease.run_id)},
            None,
        )
        step = StepAttempt.objects.get(run_id=c.lease.run_id)
        assert (step.status, step.output) == ("completed", {"n": 1})
    for c in claimed:
        run = WorkflowRun.objects.get(pk=c.lease.run_id)
        assert (run.status, run.worker_id, run.lease_token) == ("running", "w2", c.lease.token)
        assert c.run.task_name == "bench_noop" and c.run.input == {}


def test_a_write_that_lost_its_lease_fails_alone() -> None:
    for _ in range(2):
        tasks_engine.enqueue("bench_noop")
    ok, stale = claim(2)
    WorkflowRun.objects.filter(pk=stale.lease.run_id).update(lease_token=None, status="pending")
    writes = [start(ok), start(stale)]
    transitions.write_group(writes)
    assert isinstance(writes[0].result, int) and writes[0].error is None
    assert isinstance(writes[1].error, LeaseLostError)
    assert not StepAttempt.objects.filter(run_id=stale.lease.run_id).exists()


def test_the_claim_never_takes_a_run_the_same_statement_writes(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("bench_noop")
    [mine] = claim(1)
    fake_clock.advance(60)  # its lease expired; nobody reclaimed it, so it still holds it
    request = transitions.ClaimRequest("w2", PAIRS, None, 5, 30)
    claimed = transitions.write_group([complete(mine)], request)
    assert claimed == []
    assert WorkflowRun.objects.get(pk=mine.lease.run_id).status == "completed"


def test_the_claim_filter_quotes_task_names() -> None:
    weird = 'we"ird,{name}\\with'
    transitions.create_runs(
        [
            transitions.NewRun(
                task_name=weird,
                version=1,
                queue="default",
                priority=0,
                input={},
                input_hash="",
                trace_id="",
                available_at=clock.now() - timedelta(seconds=1),
            )
        ]
    )
    assert transitions.claim_runs("w", [("weird", 1)], None, 1, 30) == []
    [c] = transitions.claim_runs("w", [(weird, 1)], None, 1, 30)
    assert c.run.task_name == weird


def test_engine_statements_are_prepared_on_the_server() -> None:
    tasks_engine.enqueue("bench_noop")
    claim(1)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%expired%%'"
        )
        assert cur.fetchone()[0] >= 1
        cur.execute("SHOW plan_cache_mode")  # planned once, not per execution
        assert cur.fetchone()[0] == "force_generic_plan"


def test_a_prefetched_run_left_waiting_for_a_slot_is_handed_back(fake_clock: FakeClock) -> None:
    import time as _time

    from tasks_engine.definitions import registry
    from tasks_engine.worker import Worker, WorkerConfig
    from tasks_engine.worker.loop import PREFETCH_MAX_AGE

    tasks_engine.enqueue("bench_noop")
    worker = Worker(WorkerConfig(workflows=(registry.get("bench_noop", 1),), concurrency=2))
    slots = worker.slots
    assert slots.reserve_for_group(0) == 0  # nothing completes: no claim rides along
    assert slots.reserve(1) == 1
    [item] = claim(1)
    slots.fill([item], 1)  # queued for the next slot that frees
    worker.hand_back_stale(item.at + PREFETCH_MAX_AGE / 2)
    assert slots.busy() == 1  # not stale yet
    worker.hand_back_stale(_time.monotonic() + PREFETCH_MAX_AGE + 1)
    assert slots.busy() == 0
    run = WorkflowRun.objects.get(pk=item.lease.run_id)
    assert (run.status, run.lease_token) == ("pending", None)
    slots.stop_threads(1)
    assert slots.next_run() is None  # the queue held only the stop: the run left it


def test_a_start_after_a_cancel_is_refused_alone() -> None:
    tasks_engine.enqueue("bench_noop")
    tasks_engine.enqueue("bench_noop")
    canceled, other = claim(2)
    tasks_engine.cancel(canceled.lease.run_id, "operator")
    writes = [start(canceled), start(other)]
    transitions.write_group(writes)
    assert isinstance(writes[0].error, LeaseLostError)  # the slot then finds it still holds
    assert transitions.holds(canceled.lease)  # the run: a cancel, not a lost lease
    assert isinstance(writes[1].result, int) and writes[1].error is None
    assert not StepAttempt.objects.filter(run_id=canceled.lease.run_id).exists()


def test_a_lone_deferred_completion_shares_a_group_with_other_kinds() -> None:
    for _ in range(3):
        tasks_engine.enqueue("bench_noop")
    flushed, starting, completing = claim(3)
    first = [start(flushed), start(completing)]
    transitions.write_group(first)
    done = (transitions.Completion(first[0].result, {"n": 1}, clock.now()),)
    flush = transitions.HotWrite("deferred", flushed.lease, done, clock.now())
    writes = [flush, start(starting), complete(completing)]
    with CaptureQueriesContext(connection) as queries:
        transitions.write_group(writes)
    assert len(queries) == 1
    assert [(w.result is not None, w.error) for w in writes] == [(True, None)] * 3
    step = StepAttempt.objects.get(pk=first[0].result)
    assert (step.status, step.output) == ("completed", {"n": 1})
    again = transitions.HotWrite("deferred", flushed.lease, done, clock.now())
    transitions.write_group([again, start(starting, "second")])  # sent twice: harmless
    assert (again.result, again.error) == (True, None)


def test_a_group_fences_each_deferred_completion_once() -> None:
    """The fence of a group's deferred completions is looked up once per completion, not once
    per pair of completions and attempts (it was the inner side of the UPDATE's join: 289
    lookups of the run table for a group of 17)."""
    n = 12
    for _ in range(n):
        tasks_engine.enqueue("bench_noop")
    runs = claim(n)
    starts = [start(c) for c in runs]
    transitions.write_group(starts)
    writes = [
        transitions.HotWrite(
            "deferred", c.lease, (transitions.Completion(w.result, {}, clock.now()),), clock.now()
        )
        for c, w in zip(runs, starts, strict=True)
    ]
    # Each LockRows node of the fence reports its loops; none may have run n * n times.
    loops = lock_loops(("deferred",), writes)
    assert loops and max(loops) <= n, loops


def test_a_completion_writes_its_deferred_steps_if_and_only_if_it_is_written() -> None:
    """A group's completions carry their runs' finished steps, gated on the completion itself
    (hot_deferred_gated): a run whose lease was lost gets neither its step nor its outcome,
    its neighbours both; a stale attempt's step, sent beside the fresh attempt's completion of
    the same run, is refused."""
    for _ in range(3):
        tasks_engine.enqueue("bench_noop")
    ok, lost, other = claim(3)
    starts = [start(c) for c in (ok, lost, other)]
    transitions.write_group(starts)
    WorkflowRun.objects.filter(pk=lost.lease.run_id).update(lease_token=None, status="pending")
    stale = transitions.Lease(other.lease.run_id, lost.lease.token, "w")  # not other's token
    writes = [
        complete(ok, (transitions.Completion(starts[0].result, {"n": 1}, clock.now()),)),
        complete(lost, (transitions.Completion(starts[1].result, {"n": 2}, clock.now()),)),
        transitions.HotWrite(
            "deferred",
            stale,
            (transitions.Completion(starts[2].result, {"n": 3}, clock.now()),),
            clock.now(),
        ),
        complete(other),
    ]
    with CaptureQueriesContext(connection) as queries:
        transitions.write_group(writes)
    assert len(queries) == 1
    assert [w.result for w in writes] == ["completed", None, None, "completed"]
    assert isinstance(writes[1].error, LeaseLostError)
    assert isinstance(writes[2].error, LeaseLostError)
    steps = {s.run_id: (s.status, s.output) for s in StepAttempt.objects.all()}
    assert steps[ok.lease.run_id] == ("completed", {"n": 1})
    assert steps[lost.lease.run_id] == ("running", None)
    assert steps[other.lease.run_id] == ("running", None)
    assert WorkflowRun.objects.get(pk=lost.lease.run_id).status == "pending"
    assert WorkflowRun.objects.get(pk=other.lease.run_id).status == "completed"


def test_completing_runs_lock_no_run_row_for_their_deferred_steps() -> None:
    """The deferred steps of runs completing in the group need no fence of their own: the
    completion's UPDATE holds the run row on the same lease token. Only deferred steps of runs
    not completing in the group lock their run's row (one LockRows loop each)."""
    n = 6
    for _ in range(n + 1):
        tasks_engine.enqueue("bench_noop")
    runs = claim(n + 1)
    starts = [start(c) for c in runs]
    transitions.write_group(starts)
    writes = [
        complete(c, (transitions.Completion(w.result, {}, clock.now()),))
        for c, w in zip(runs[:n], starts, strict=False)
    ]
    flushed = (transitions.Completion(starts[n].result, {}, clock.now()),)
    writes.append(transitions.HotWrite("deferred", runs[n].lease, flushed, clock.now()))
    loops = lock_loops(("deferred", "completes"), writes)
    assert loops == [1], loops  # the one flushed step's fence; none for the six completions


def test_the_group_writer_plans_without_sequential_scans() -> None:
    """Its session runs only the hot statements, each a primary-key or partial-index lookup; a
    generic plan made while the step table was young scanned all of it (bench/PROFILE.md)."""
    writer = GroupCommit(SlotPool(1, 0), transitions.ClaimRequest("w", PAIRS, None, 0, 30), None)
    try:
        writer._tune_session()
        with connection.cursor() as cur:
            cur.execute("SHOW enable_seqscan")
            assert cur.fetchone() == ("off",)
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET enable_seqscan")


def test_a_detached_completion_that_fails_tells_its_run_it_was_not_written() -> None:
    """Nobody waits for a handed-off completion: when it fails (its fence, or the writer
    thread's death), `ended` hears None, so that the claim's span still ends
    (runtime/executor.py)."""
    from tasks_engine.db.outages import Outage
    from tasks_engine.definitions import registry
    from tasks_engine.observe.logs import get_logger
    from tasks_engine.worker import Worker, WorkerConfig

    for _ in range(2):
        tasks_engine.enqueue("bench_noop")
    fenced, orphaned = claim(2)
    WorkflowRun.objects.filter(pk=fenced.lease.run_id).update(lease_token=None, status="pending")
    worker = Worker(WorkerConfig(workflows=(registry.get("bench_noop", 1),), concurrency=2))
    log = get_logger()
    writer = GroupCommit(worker.slots, transitions.ClaimRequest("w", PAIRS, None, 0, 30), log)
    heard: list[str | None] = []
    writes = [complete(fenced), complete(orphaned)]
    for write in writes:
        write.detached, write.ended = True, heard.append
    writer.commit([writes[0]], Outage(log, "group commit"))
    assert isinstance(writes[0].error, LeaseLostError) and heard == [None]
    writer._queue.put((writes[1], None))  # queued as the writer thread died
    writer._fail_queued()
    assert writes[1].error is not None and heard == [None, None]
