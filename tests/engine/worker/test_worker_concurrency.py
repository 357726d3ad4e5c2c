"""A queue's `worker_concurrency`: a cap of each worker process, enforced by its claims on both
databases (the claim takes at most the places the worker has left), and kept by its slot pool
from the claim that takes a run until the slot that ran it lets it go."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core import checks

import tasks_engine
from tasks_engine import transitions
from tasks_engine.checks import check_settings
from tasks_engine.conf import engine_settings
from tasks_engine.models import WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.transitions import claim_mode
from tasks_engine.worker.slots import Held, SlotPool
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

FLOW = [("flow-plain", 1), ("flow-disk", 1), ("b", 1)]
NO_CTX: Any = None


@pytest.fixture(autouse=True)
def _capped(settings: Any) -> Iterator[None]:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"flow-io": {"worker_concurrency": 2}},
    }
    yield
    claim_mode.forget_keyed()


def claim(
    worker: str, room: int | None, n: int = 10, lease: float = 600.0
) -> list[transitions.Claimed]:
    worker_room = None if room is None else {"flow-io": room}
    return transitions.claim_runs(worker, FLOW, None, n, lease, (), worker_room)


def capped(claimed: list[transitions.Claimed]) -> int:
    return sum(1 for c in claimed if c.run.queue == "flow-io")


def test_a_worker_takes_no_more_than_its_places_and_other_queues_are_not_held_back() -> None:
    for _ in range(5):
        tasks_engine.enqueue("flow-plain", {})
    other = tasks_engine.enqueue("b").run_id
    got = claim("w1", 2)
    assert capped(got) == 2 and other in [c.run.pk for c in got]
    assert claim("w1", 0) == []  # its places are taken: the other three stay pending
    assert WorkflowRun.objects.filter(status="pending").count() == 3
    assert capped(claim("w2", 2)) == 2  # another worker has places of its own
    assert capped(claim("w3", 1)) == 1


def test_a_claim_without_the_worker_s_room_takes_at_most_the_cap() -> None:
    for _ in range(5):
        tasks_engine.enqueue("flow-plain", {})
    assert capped(claim("w", None)) == 2


def test_the_cap_holds_with_a_key_and_a_fleet_wide_limit_of_the_same_queue(settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"flow-io": {"worker_concurrency": 2, "concurrency": 3}},
    }
    for disk in ("a", "b", "c", "d"):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key=f"disk:{disk}")
    first = claim("w1", 2)
    assert capped(first) == 2 and len({c.run.concurrency_key for c in first}) == 2
    assert capped(claim("w2", 2)) == 1  # the queue's fleet-wide 3 is the tighter limit now
    assert claim("w3", 2) == []


def test_a_retaken_expired_lease_takes_one_of_the_worker_s_places(fake_clock: FakeClock) -> None:
    for _ in range(3):
        tasks_engine.enqueue("flow-plain", {})
    assert capped(claim("dead", 3, lease=1.0)) == 3  # a worker without the cap's setting
    fake_clock.advance(5)  # its leases expire: the runs are retaken, still running
    got = claim("w", 2)
    assert capped(got) == 2
    assert {c.run.worker_id for c in got} == {"w"}
    assert WorkflowRun.objects.filter(worker_id="dead").count() == 1


def test_finishing_a_run_gives_its_place_back() -> None:
    for _ in range(3):
        tasks_engine.enqueue("flow-plain", {})
    got = claim("w", 2)
    assert capped(got) == 2
    for c in got[:1]:
        wf, ctx = executor.build_context(c.run, c.lease, threading.Event(), c.prestarted)
        executor.execute(c.run, wf, ctx)
    assert capped(claim("w", 1)) == 1


@pytest.mark.parametrize("value", [0, "2", True, 1.5])
def test_a_bad_worker_concurrency_is_a_check_error_naming_it(settings: Any, value: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"io": {"worker_concurrency": value}},
    }
    errors = [e for e in check_settings() if e.level >= checks.ERROR]
    assert [e.id for e in errors] == ["tasks_engine.E006"]
    assert "QUEUES['io']['worker_concurrency'] must be an integer >= 1" in errors[0].msg


def test_worker_concurrency_parses_beside_the_other_limits(settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"io": {"worker_concurrency": 1, "concurrency": 4, "rate_limit": "30/m"}},
    }
    io = engine_settings().queues["io"]
    assert (io.worker_concurrency, io.concurrency, io.rate) == (1, 4, (30, 60.0))
    assert claim_mode.guarded([("b", 1)], ["io"])  # a capped queue's runs take the guarded claim


# -- the slot pool's count: from the claim to the slot's release ------------------------------


def _claimed(n: int) -> list[transitions.Claimed]:
    for _ in range(n):
        tasks_engine.enqueue("flow-plain", {})
    got = claim("w", n, n=n)
    assert capped(got) == n
    return got


def _held(pool: SlotPool, c: transitions.Claimed) -> Held:
    held = Held(c.lease, NO_CTX, NO_CTX, renewed_at=0.0)  # the pool never touches these
    pool.hold(held)
    return held


def test_the_pool_counts_queued_and_executing_runs_until_they_leave() -> None:
    pool = SlotPool(concurrency=4, prefetch=8)
    pool.caps = {"flow-io": 2}
    a, b = _claimed(2)
    pool.fill([a, b], pool.reserve(2))
    assert pool.worker_room() == {"flow-io": 0}
    assert pool.next_run() is a
    _held(pool, a)
    assert pool.worker_room() == {"flow-io": 0}  # taken off the queue, now in a slot
    pool.release(a.lease)
    assert pool.worker_room() == {"flow-io": 1}
    assert pool.take_stale(now=b.at + 3600, max_age=1.0) == [b]  # handed back from the queue
    assert pool.worker_room() == {"flow-io": 2}


def test_a_written_off_run_gives_its_place_up_once() -> None:
    pool = SlotPool(concurrency=4, prefetch=0)
    pool.caps = {"flow-io": 1}
    [a] = _claimed(1)
    pool.fill([a], pool.reserve(1))
    assert pool.next_run() is a
    held = _held(pool, a)
    assert pool.write_off(held)  # its thread ignores the abort: the slot is replaced
    assert pool.worker_room() == {"flow-io": 1}
    pool.release(a.lease)  # the stuck thread ends at last: nothing is given back twice
    assert pool.worker_room() == {"flow-io": 1}
