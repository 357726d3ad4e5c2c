"""The heartbeat (worker/heartbeat.py) on a slot pool of its own, without a worker: it gets the
pool and narrow callbacks, and tells each attempt what its own lease's renewal found."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

import tasks_engine
from tasks_engine import LeaseLostError, TaskCanceledError, transitions
from tasks_engine.observe.logs import get_logger
from tasks_engine.runtime.attempt_handle import AttemptHandle
from tasks_engine.runtime.context import AbortSignal
from tasks_engine.worker.heartbeat import Heartbeat, WorkerHooks
from tasks_engine.worker.slots import Held, SlotPool
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db


def heartbeat(pool: SlotPool, calls: list[str]) -> Heartbeat:
    hooks = WorkerHooks(
        hand_back_stale=lambda now: calls.append("hand back"),
        write_off=lambda held: calls.append(f"write off {held.lease.token}"),
        beat=lambda now: calls.append("beat"),
    )
    return Heartbeat(pool, hooks, lease_seconds=30, heartbeat_seconds=10, log=get_logger())


def held(lease: transitions.Lease) -> Held:
    ctx: Any = types.SimpleNamespace(abort_signal=AbortSignal(), logger=get_logger())
    handle = AttemptHandle(lease, has_parent=False, cancel_requested=False)
    return Held(lease, ctx, handle, renewed_at=0.0)


def test_a_stale_attempt_is_lost_and_the_fresh_one_is_told_of_its_cancel(
    fake_clock: FakeClock,
) -> None:
    """A stale and a fresh lease of one run in one pool (the worker's lease expired during an
    outage while its slot still executes, and its next claim took the run again): the stale
    attempt loses its lease, the fresh one is renewed and told of the cancel, and neither is
    told the other's result."""
    run_id = tasks_engine.enqueue("b").run_id
    [stale] = transitions.claim_runs("w", [("b", 1)], None, 1, 30)
    fake_clock.advance(31)
    [fresh] = transitions.claim_runs("w", [("b", 1)], None, 1, 30)
    tasks_engine.cancel(run_id, "by hand")
    pool = SlotPool(concurrency=2, prefetch=0)
    pool.reserve(2)
    old, new = held(stale.lease), held(fresh.lease)
    pool.hold(old)
    pool.hold(new)
    calls: list[str] = []
    renewed = heartbeat(pool, calls).renew_once()
    assert set(renewed) == {fresh.lease.key}
    assert old.lost and isinstance(old.ctx.abort_signal.reason, LeaseLostError)
    assert old.renewed_at == 0.0 and not old.handle.cancel_requested
    assert not new.lost and new.renewed_at > 0.0 and new.handle.cancel_requested
    assert isinstance(new.ctx.abort_signal.reason, TaskCanceledError)
    assert pool.held() == [new]
    assert calls == []  # renewing needs nothing of the worker


def test_a_stuck_run_is_written_off_through_the_worker_s_callback(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b")
    [claimed] = transitions.claim_runs("w", [("b", 1)], None, 1, 30)
    pool = SlotPool(concurrency=1, prefetch=0)
    pool.reserve(1)
    h = held(claimed.lease)
    pool.hold(h)
    calls: list[str] = []
    beat = heartbeat(pool, calls)
    beat.abort(h, LeaseLostError("gone"))
    assert h.abort_deadline is not None
    h.abort_deadline = 0.0  # its step ignored the abort past the grace
    beat.write_off_stuck()
    assert calls == [f"write off {claimed.lease.token}"]


@pytest.mark.parametrize("slot", ["released", "handed-over", "released-a-moment-later"])
def test_a_renewal_that_races_the_run_s_completion_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, slot: str
) -> None:
    """The heartbeat takes the runs held, the run completes (its token cleared) and its slot
    lets it go (or its last write took the slot along, or the slot lets it go just after the
    renewal's answer), then the renewal finds no token: the run ended, its lease was not
    lost, and it is neither aborted nor logged as lost."""
    tasks_engine.enqueue("b")
    [claimed] = transitions.claim_runs("w", [("b", 1)], None, 1, 30)
    pool = SlotPool(concurrency=1, prefetch=0)
    pool.reserve(1)
    h = held(claimed.lease)
    pool.hold(h)
    renew = transitions.renew_leases

    def completion_commits_first(leases: Any, lease_seconds: float) -> Any:
        if slot == "handed-over":
            pool.hand_over(claimed.lease)
        transitions.complete_run(claimed.lease, {"ok": True}, [])
        if slot == "released":
            pool.release(claimed.lease)
        if slot == "released-a-moment-later":  # a slot thread that wrote its run's end alone
            threading.Timer(0.01, pool.release, [claimed.lease]).start()
        return renew(leases, lease_seconds)

    monkeypatch.setattr(transitions, "renew_leases", completion_commits_first)
    lost: list[str] = []
    ctx: Any = h.ctx
    ctx.logger = types.SimpleNamespace(warning=lambda event, **kw: lost.append(event))
    assert heartbeat(pool, []).renew_once() == {}
    assert tasks_engine.get_run(claimed.lease.run_id).status == "completed"
    assert not h.lost and not h.ctx.abort_signal.aborted and lost == []
