"""The slot pool (worker/slots.py): one lock over slot accounting and the runs held, keyed by
(run, lease token)."""

from __future__ import annotations

import uuid
from typing import Any

from tasks_engine import transitions
from tasks_engine.worker.slots import Held, SlotPool

NO_CTX: Any = None  # the pool never touches a run's context or handle here


def held(lease: transitions.Lease) -> Held:
    return Held(lease, NO_CTX, NO_CTX, renewed_at=0.0)


def claimed() -> transitions.Claimed:
    return transitions.Claimed(transitions.Lease(uuid.uuid4(), uuid.uuid4(), "w"), NO_CTX)


def test_a_stale_and_a_fresh_attempt_of_one_run_are_held_apart() -> None:
    run = uuid.uuid4()
    stale = transitions.Lease(run, uuid.uuid4(), "w")
    fresh = transitions.Lease(run, uuid.uuid4(), "w")
    pool = SlotPool(concurrency=2, prefetch=0)
    assert pool.reserve(2) == 2
    pool.hold(held(stale))
    pool.hold(held(fresh))  # the old table (by run id) overwrote the stale entry here
    assert pool.held_ids() == (run, run) and pool.yet_to_write() == 2
    pool.release(stale)  # the stale slot ends: the fresh attempt stays held (and renewed)
    assert [h.lease.token for h in pool.held()] == [fresh.token]
    assert pool.busy() == 1


def test_a_completion_that_takes_its_slot_along_frees_it_in_the_group() -> None:
    pool = SlotPool(concurrency=1, prefetch=0)
    lease = transitions.Lease(uuid.uuid4(), uuid.uuid4(), "w")
    assert pool.reserve(1) == 1
    pool.hold(held(lease))
    assert pool.hand_over(lease)
    pool.release(lease)
    assert pool.busy() == 1  # the slot went with the completion
    pool.freed.clear()
    pool.after_group([], reserved=0, handed=1)  # nothing claimed: the group frees it
    assert pool.busy() == 0 and pool.freed.is_set()


def test_a_written_off_run_hands_over_nothing() -> None:
    pool = SlotPool(concurrency=1, prefetch=0)
    lease = transitions.Lease(uuid.uuid4(), uuid.uuid4(), "w")
    pool.reserve(1)
    h = held(lease)
    pool.hold(h)
    assert pool.write_off(h)  # a replacement thread takes the slot
    assert pool.busy() == 0
    assert not pool.hand_over(lease)  # its completion, when it comes, is written at once
    assert pool.release(lease) is True  # the stuck thread retires
    assert pool.busy() == 0


def test_prefetched_runs_count_as_yet_to_write_only_while_a_slot_thread_is_idle() -> None:
    pool = SlotPool(concurrency=2, prefetch=2)
    assert pool.reserve(2) == 2
    a, b = (transitions.Lease(uuid.uuid4(), uuid.uuid4(), "w") for _ in range(2))
    pool.hold(held(a))
    pool.fill([claimed(), claimed()], 2)  # two prefetched runs, one idle slot thread
    assert pool.yet_to_write() == 2  # the run held, and the one queued run a thread takes up
    pool.hold(held(b))
    assert pool.yet_to_write() == 2  # every thread holds a run: the queue waits for a group
    pool.stop_threads(2)
    assert pool.yet_to_write() == 2  # a stop is not a run


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def start_runs(pool: SlotPool, clock: Clock, n: int, per_second: float) -> None:
    """The slot threads take up `n` runs at `per_second`; the group asks the depth as it goes."""
    for _ in range(n):
        pool.fill([claimed()], 1)  # (the slot it took stays counted as it was)
        assert pool.next_run() is not None
        clock.now += 1 / per_second
        pool.prefetch_depth()


def test_the_prefetch_follows_the_rate_runs_start_at() -> None:
    clock = Clock()
    pool = SlotPool(concurrency=4, prefetch=32, monotonic=clock)
    assert pool.prefetch_depth() == 0  # nothing started yet: nothing claimed ahead
    start_runs(pool, clock, 2000, per_second=2000)  # quick runs: 0.1 s of them is 200
    assert pool.prefetch_depth() == 32  # ... up to the worker's cap
    start_runs(pool, clock, 20, per_second=4)  # the runs became slow (a quarter second each)
    assert pool.prefetch_depth() == 0  # none is held back from other workers for a slot


def test_a_group_claims_ahead_only_as_deep_as_the_rate_asks() -> None:
    clock = Clock()
    pool = SlotPool(concurrency=2, prefetch=100, monotonic=clock)
    pool.backlog = True
    start_runs(pool, clock, 500, per_second=200)  # 20 runs started in the last 0.1 s
    depth = pool.prefetch_depth()
    assert 15 <= depth <= 20
    assert pool.reserve(2) == 2  # both slots execute
    # A completion hands its slot over: the group claims a run for it, and `depth` ahead.
    assert pool.reserve_for_group(1) == 1 + depth


def test_when_the_claim_loop_claims_ahead_the_group_claims_nothing() -> None:
    clock = Clock()
    pool = SlotPool(concurrency=2, prefetch=100, monotonic=clock)
    start_runs(pool, clock, 500, per_second=200)
    depth = pool.prefetch_depth()
    pool.claims_ahead = True  # flow control guards the claims: the loop claims, beside the group
    assert pool.free() == 2  # no backlog yet: only the free slots
    pool.backlog = True
    assert pool.free() == 2 + depth  # under a backlog, the prefetch's places too
    assert pool.reserve(1000) == 2 + depth
    assert pool.reserve_for_group(1) == 0  # the group only writes


def test_a_guarded_claim_cut_short_by_a_limit_keeps_claiming_ahead() -> None:
    """A limit lets a guarded claim take fewer runs than places: the next claim still claims
    ahead (not only once the prefetched runs drained to the free slots); a claim that takes
    nothing while nothing is in flight ends the backlog."""
    clock = Clock()
    pool = SlotPool(concurrency=2, prefetch=100, monotonic=clock)
    start_runs(pool, clock, 500, per_second=200)
    depth = pool.prefetch_depth()
    pool.claims_ahead = True
    pool.backlog = True
    asked = pool.reserve(pool.free())
    assert asked == 2 + depth
    assert not pool.after_claim([claimed() for _ in range(asked // 2)], asked)
    assert pool.backlog and pool.free() == 2 + depth - asked // 2
    while pool.busy():  # the slots run every run; the claims find none
        assert pool.next_run() is not None
        pool.release(transitions.Lease(uuid.uuid4(), uuid.uuid4(), "w"))
    assert not pool.after_claim([], pool.reserve(pool.free()))
    assert not pool.backlog and pool.free() == 2


def test_a_plain_claim_that_falls_short_ends_the_backlog() -> None:
    pool = SlotPool(concurrency=4, prefetch=0)
    pool.backlog = True
    assert not pool.after_claim([claimed()], pool.reserve(4))
    assert not pool.backlog
    assert pool.after_claim([claimed(), claimed(), claimed()], pool.reserve(3))
    assert pool.backlog


def test_with_async_runs_the_concurrency_caps_both_kinds_together() -> None:
    """A worker with async workflows: slot threads and the event loop take runs from one
    count, so --concurrency bounds the runs in flight of both kinds together."""
    pool = SlotPool(concurrency=2, prefetch=0)
    plain, first, second = claimed(), claimed(), claimed()
    pool.is_async = lambda c: c is not plain
    pool.shared_cap = True
    woken: list[bool] = []
    pool.async_ready = lambda: woken.append(True)
    pool.fill([plain, first, second], pool.reserve(3))
    assert woken  # the loop was told async runs are queued
    assert pool.next_run() is plain
    assert pool.next_async(10) == [first]  # one place left, not two
    assert pool.next_async(10) == []
    woken.clear()
    pool.release(plain.lease)
    assert woken  # a place freed while an async run waits for one
    assert pool.next_async(10) == [second]
