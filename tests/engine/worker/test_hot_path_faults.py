"""The hot path under faults: a row the database refuses, a stale and a fresh lease of one run
in one group, a failing deferred flush, a worker that would reclaim its own run, and a dead
group-writer thread. In-process, on the real database."""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any

import pytest
from django.db import OperationalError, connection

import tasks_engine
from tasks_engine import LeaseLostError, clock, transitions
from tasks_engine.db.outages import Outage
from tasks_engine.exceptions import EngineUnavailable
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.observe.logs import get_logger
from tasks_engine.worker.group_commit import GroupCommit
from tasks_engine.worker.slots import SlotPool
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)
PAIRS = [("bench_noop", 1)]


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("group commit needs data-modifying CTEs (PostgreSQL)")


def writer() -> GroupCommit:
    """A group writer of its own, for a worker of two slots claiming bench_noop."""
    claims = transitions.ClaimRequest("w", PAIRS, None, 0, 30)
    return GroupCommit(SlotPool(2, 1), claims, get_logger())


def start(c: transitions.Claimed) -> transitions.HotWrite:
    return transitions.HotWrite("start", c.lease, (), clock.now(), "noop", attempt=1, run_pass=1)


def test_a_row_the_database_refuses_fails_alone(postgres_only: None) -> None:
    for _ in range(3):
        tasks_engine.enqueue("bench_noop")
    poisoned, healthy, other = transitions.claim_runs("w", PAIRS, None, 3, 30)
    bad = transitions.HotWrite("complete", poisoned.lease, (), clock.now())
    bad.output = math.nan  # got past every check somehow: jsonb refuses it
    good = [start(healthy), start(other)]
    group = writer()
    group.commit([bad, *good], Outage(group.log, "test"))
    assert bad.error is not None and bad.result is None
    assert all(isinstance(g.result, int) and g.error is None for g in good)
    assert (
        StepAttempt.objects.filter(run_id__in=[healthy.lease.run_id, other.lease.run_id]).count()
        == 2
    )
    assert WorkflowRun.objects.get(pk=poisoned.lease.run_id).status == "running"


def test_a_stale_and_a_fresh_lease_of_one_run_in_one_group(
    postgres_only: None, fake_clock: FakeClock
) -> None:
    tasks_engine.enqueue("bench_noop")
    [stale] = transitions.claim_runs("w1", PAIRS, None, 1, 30)
    fake_clock.advance(31)
    [fresh] = transitions.claim_runs("w2", PAIRS, None, 1, 30)
    assert stale.lease.run_id == fresh.lease.run_id
    writes = [start(stale), start(fresh)]
    transitions.write_group(writes)
    assert isinstance(writes[0].error, LeaseLostError) and writes[0].result is None
    assert isinstance(writes[1].result, int) and writes[1].error is None
    [step] = StepAttempt.objects.filter(run_id=fresh.lease.run_id)
    assert step.lease_token == fresh.lease.token


def test_a_worker_never_reclaims_a_run_its_slot_still_executes(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("bench_noop")
    [mine] = transitions.claim_runs("w1", PAIRS, None, 1, 30)
    fake_clock.advance(31)  # an outage let the lease expire while the slot still runs it
    held = (mine.lease.run_id,)
    assert transitions.claim_runs("w1", PAIRS, None, 1, 30, held) == []
    [other] = transitions.claim_runs("w2", PAIRS, None, 1, 30)  # another worker may
    assert other.lease.run_id == mine.lease.run_id


class RefusingWriter:
    """A writer whose database is unreachable (what the group writer reports then)."""

    def send(self, write: transitions.HotWrite) -> None:
        write.error = OperationalError("connection reset")

    def hand_off(self, write: transitions.HotWrite) -> None:
        self.send(write)
        write.outcome()


def test_a_failing_deferred_flush_keeps_the_completion_for_the_next_write() -> None:
    tasks_engine.enqueue("bench_noop")
    [c] = transitions.claim_runs("w", PAIRS, None, 1, 30)
    step = transitions.start_step(c.lease, "s", "function", 1, 1)
    transitions.defer_step_completion(c.lease, step, {"out": 1})
    offline = dataclasses.replace(c.lease, writer=RefusingWriter())  # same deferred queue
    with pytest.raises(EngineUnavailable):
        transitions.flush_deferred(offline)  # what the heartbeat does
    assert [d.step_id for d in c.lease.deferred.pending()] == [step]
    transitions.complete_run(c.lease, "done", [])
    attempt = StepAttempt.objects.get(pk=step)
    assert (attempt.status, attempt.output) == ("completed", {"out": 1})
    assert c.lease.deferred.pending() == ()  # settled once the completion committed


def test_a_completion_sent_twice_is_harmless() -> None:
    tasks_engine.enqueue("bench_noop")
    [c] = transitions.claim_runs("w", PAIRS, None, 1, 30)
    step = transitions.start_step(c.lease, "s", "function", 1, 1)
    transitions.defer_step_completion(c.lease, step, {"out": 1})
    taken = c.lease.deferred.pending()  # the heartbeat read it; the slot's write carries it too
    transitions.complete_run(c.lease, "done", [])
    late = transitions.HotWrite("deferred", c.lease, taken, clock.now())
    transitions.write_alone(late)  # the heartbeat's send, after the run completed
    assert (late.result, late.error) == (True, None)
    other = transitions.HotWrite("deferred", c.lease, taken, clock.now())
    other.deferred = (transitions.Completion(step + 1000, {}, clock.now()),)
    transitions.write_alone(other)  # a completion nobody wrote, of a lease that is gone
    assert isinstance(other.error, LeaseLostError)
    attempt = StepAttempt.objects.get(pk=step)
    assert (attempt.status, attempt.output) == ("completed", {"out": 1})


def test_a_dead_group_writer_fails_what_it_held_and_writes_nothing_more_itself(
    postgres_only: None,
) -> None:
    for _ in range(2):
        tasks_engine.enqueue("bench_noop")
    lost, later = transitions.claim_runs("w", PAIRS, None, 2, 30)
    group = writer()
    real_gather = group._gather

    def broken_gather() -> list[tuple[transitions.HotWrite, threading.Event | None]]:
        real_gather()  # takes the write off the queue...
        raise RuntimeError("bug in the writer")  # ...and dies with it

    group._gather = broken_gather  # type: ignore[method-assign]
    group.start()
    write = start(lost)
    group.send(write)  # returns once the slot's watch sees the writer dead
    assert isinstance(write.error, EngineUnavailable) and write.result is None
    assert "group commit thread died" in str(write.error)
    group.join(5)
    assert group.dead and not group.is_alive()  # what the worker's watch sees (test_side_loops)
    assert not StepAttempt.objects.filter(run_id=lost.lease.run_id).exists()
    # The worker is stopping: its slots' writes go alone, on their own connections, so that
    # they end their runs cleanly (a step starts, a run is handed back).
    after = start(later)
    group.send(after)
    assert isinstance(after.result, int) and after.error is None


def test_a_guarded_workers_group_never_waits_for_a_queues_claim_lock(
    postgres_only: None, settings: Any
) -> None:
    """Flow control guards this worker's claims: they go on the claim loop's connection, so the
    group writer, which every slot's step start waits for, never waits behind another worker's
    claim of a limited queue (which holds that queue's lock until it commits)."""
    import psycopg

    from tasks_engine.transitions.flow_claims_pg import QUEUE_LOCK
    from tests.helpers import database_url

    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"default": {"concurrency": 50}}}
    for _ in range(3):
        tasks_engine.enqueue("bench_noop")
    [done] = transitions.claim_runs("w", PAIRS, None, 1, 30)
    slots = SlotPool(2, 4)
    assert slots.reserve(1) == 1
    slots.backlog = True  # a backlog: a group completing a run would claim along
    slots.claims_ahead = True  # what the worker's loop sets while its claims are guarded
    group = GroupCommit(slots, transitions.ClaimRequest("w", PAIRS, None, 0, 30), get_logger())
    finish = transitions.HotWrite("complete", done.lease, (), clock.now())
    finish.detached = True  # the slot goes with the completion

    def write() -> None:  # as the writer thread does, on a connection of its own
        try:
            group.commit([finish], Outage(group.log, "test"))
        finally:
            connection.close()

    with psycopg.connect(database_url(), autocommit=False) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s, hashtext('default'))", [QUEUE_LOCK])
        writing = threading.Thread(target=write)
        writing.start()
        writing.join(5.0)
        stuck = writing.is_alive()
        other.rollback()  # another worker's claim ends
    writing.join()
    assert not stuck  # committed while the queue's lock was held elsewhere
    assert finish.error is None
    assert WorkflowRun.objects.get(pk=done.lease.run_id).status == "completed"
    assert WorkflowRun.objects.filter(status="pending").count() == 2  # the group claimed none
