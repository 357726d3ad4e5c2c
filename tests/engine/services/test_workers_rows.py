"""Worker rows (tasks_engine/workers.py) in-process: the beat's upsert, removal, the dead-worker
service on its own, and what live workers serve."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.db.sql import db_clock
from tasks_engine.definitions import registry
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.models import WorkflowRun
from tasks_engine.services.fleet import list_workers, unserved_runs
from tasks_engine.transitions import reap_dead_workers
from tasks_engine.worker import Worker, WorkerConfig

pytestmark = pytest.mark.django_db(transaction=True)


def worker(*names: str, queues: tuple[str, ...] = ()) -> Worker:
    wfs = tuple(registry.get(n) for n in names or ("noop",))
    return Worker(WorkerConfig(workflows=wfs, queues=queues, concurrency=3))


def age(worker_id: str, seconds: float) -> None:
    WorkerRow.objects.filter(pk=worker_id).update(
        last_heartbeat=db_clock() - timedelta(seconds=seconds)
    )


def two_holders() -> tuple[Worker, Worker, tuple[Any, Any], tuple[Any, Any]]:
    """Two beating workers, each holding one of two fresh runs: (dead-to-be, live, the runs'
    ids, their claims)."""
    dead, live = worker(), worker()
    for w in (dead, live):
        w.registration.beat()
    a = tasks_engine.enqueue("noop", {"n": 1}).run_id
    b = tasks_engine.enqueue("noop", {"n": 2}).run_id
    [held_dead] = transitions.claim_runs(dead.id, dead.pairs, None, 1, 120.0)
    [held_live] = transitions.claim_runs(live.id, live.pairs, None, 1, 120.0)
    return dead, live, (a, b), (held_dead, held_live)


def test_a_beat_writes_the_row_and_refreshes_it() -> None:
    w = worker("noop", queues=("io",))
    w.registration.beat()
    row = WorkerRow.objects.get(pk=w.id)
    assert (row.pid, row.concurrency, row.queues, row.tasks, row.runs_held) == (
        w.registration.pid,
        3,
        ["io"],
        ["noop@1"],
        0,
    )
    age(w.id, 60)
    w.registration.beat()
    assert WorkerRow.objects.get(pk=w.id).last_heartbeat > db_clock() - timedelta(seconds=30)
    assert WorkerRow.objects.count() == 1  # one row per worker, whatever the number of beats


def test_remove_deletes_the_row_and_no_later_beat_brings_it_back() -> None:
    w = worker()
    w.registration.beat()
    w.registration.remove()
    w.registration.beat()  # a heartbeat still in flight at shutdown
    assert not WorkerRow.objects.filter(pk=w.id).exists()


def test_reap_releases_the_runs_of_a_dead_worker_only() -> None:
    dead, live, (a, b), (held_dead, held_live) = two_holders()
    assert {held_dead.lease.run_id, held_live.lease.run_id} == {a, b}
    assert reap_dead_workers() == {"workers": 0, "runs": 0}
    age(dead.id, 11)  # older than DEAD_WORKER_SECONDS (10)
    assert reap_dead_workers() == {"workers": 1, "runs": 1}
    assert list(WorkerRow.objects.values_list("id", flat=True)) == [live.id]
    # The dead worker's run is claimable now, long before its 120 s lease ends; the live one's
    # is not.
    other = worker()
    [retaken] = transitions.claim_runs(other.id, other.pairs, None, 2, 120.0)
    assert retaken.lease.run_id == held_dead.lease.run_id
    assert WorkflowRun.objects.get(pk=held_live.lease.run_id).worker_id == live.id
    assert reap_dead_workers() == {"workers": 0, "runs": 0}  # idempotent


def test_a_dead_workers_runs_are_claimable_at_once_even_if_the_leaders_clock_is_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reaper used to set the runs' lease expiry to the leader's own clock: with that clock
    # a minute ahead of the claimers', the runs stayed unclaimable for that minute. Found by
    # the worker-rows audit (a worker whose clock is skewed).
    dead = worker()
    dead.registration.beat()
    run_id = tasks_engine.enqueue("noop").run_id
    [held] = transitions.claim_runs(dead.id, dead.pairs, None, 1, 120.0)
    age(dead.id, 11)
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(seconds=60))
    assert reap_dead_workers() == {"workers": 1, "runs": 1}
    monkeypatch.setattr(clock, "now", real_now)
    other = worker()
    [retaken] = transitions.claim_runs(other.id, other.pairs, None, 1, 120.0)
    assert retaken.lease.run_id == held.lease.run_id == run_id


def test_a_reaped_worker_that_was_only_stalled_beats_its_row_back() -> None:
    w = worker()
    w.registration.beat()
    age(w.id, 11)
    reap_dead_workers()
    w.registration.beat()
    assert WorkerRow.objects.filter(pk=w.id).exists()


def test_list_workers_shows_runs_held_liveness_and_no_leader() -> None:
    w, old = worker(), worker()
    w.registration.beat()
    old.registration.beat()
    age(old.id, 11)
    run_id = tasks_engine.enqueue("noop").run_id
    transitions.claim_runs(w.id, w.pairs, None, 1, 30.0)
    views = {v.id: v for v in list_workers()}
    assert views[w.id].alive and views[w.id].runs == [str(run_id)]
    assert not views[old.id].alive and views[old.id].runs == []
    assert not any(v.leader for v in views.values())


def test_unserved_runs_are_known_only_once_a_worker_is_alive() -> None:
    tasks_engine.enqueue("noop")
    tasks_engine.enqueue("a", version=2)
    io = tasks_engine.enqueue("noop", queue="io").run_id
    assert unserved_runs() is None  # no live worker: nothing is known
    w = worker("noop", queues=("default",))
    w.registration.beat()
    assert unserved_runs() == [
        {"task": "a", "version": 2, "queue": "default", "runs": 1, "at_least": False},
        {"task": "noop", "version": 1, "queue": "io", "runs": 1, "at_least": False},
    ]
    WorkflowRun.objects.filter(pk=io).update(status="canceled", finished_at=db_clock())
    age(w.id, 11)
    assert unserved_runs() is None  # its only worker is dead


def test_a_retaken_runs_claim_delay_counts_from_the_reap_not_from_the_last_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tasks_claim_delay_seconds is measured from the claimed run's due_at, the claim's copy of
    # its available_at. A dead worker's run is claimable from the reap, although its lease
    # expiry is the worker's last beat: the reap's time is what the claim keeps as due_at (a
    # minute-old beat would have counted a minute of backlog that never was).
    dead = worker()
    dead.registration.beat()
    tasks_engine.enqueue("noop")
    transitions.claim_runs(dead.id, dead.pairs, None, 1, 120.0)
    age(dead.id, 60)
    reaped_from = db_clock()
    assert reap_dead_workers() == {"workers": 1, "runs": 1}
    other = worker()
    [retaken] = transitions.claim_runs(other.id, other.pairs, None, 1, 120.0)
    assert retaken.run.due_at >= reaped_from
    # A lease that ran out on its own is due at its expiry, as before.
    expiry = WorkflowRun.objects.get(pk=retaken.lease.run_id).available_at
    real_now = clock.now
    monkeypatch.setattr(clock, "now", lambda: real_now() + timedelta(seconds=121))
    third = worker()
    [expired] = transitions.claim_runs(third.id, third.pairs, None, 1, 120.0)
    assert expired.run.due_at == expiry


def test_a_cancel_requested_of_a_holder_that_dies_since_ends_the_run() -> None:
    """The cancel came while the worker was alive (a request for it), then the worker died
    (SIGKILL) and no live worker serves the run's version (a deploy retired it): no claim
    would ever end the run. The leader's service does, once the holder is dead and its lease
    expired; it leaves a live holder's requested run alone."""
    from tasks_engine.models import StepAttempt

    dead, _live, (a, b), (held_dead, held_live) = two_holders()
    transitions.start_step(held_dead.lease, "s", "function", 1, 1)
    for run_id in (a, b):
        assert tasks_engine.cancel(run_id, "retired") is True
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"running"}
    assert transitions.end_orphaned_cancels() == 0  # both holders alive, leases running
    age(dead.id, 11)
    reap_dead_workers()  # the dead worker's lease expires at its last beat
    assert transitions.end_orphaned_cancels() == 1
    ended = WorkflowRun.objects.get(pk=held_dead.lease.run_id)
    assert (ended.status, ended.cancel_reason, ended.lease_token) == ("canceled", "retired", None)
    assert ended.finished_at is not None
    step = StepAttempt.objects.get(run_id=ended.pk)
    assert (step.status, step.counted) == ("abandoned", False)
    assert WorkflowRun.objects.get(pk=held_live.lease.run_id).status == "running"
    assert transitions.end_orphaned_cancels() == 0
