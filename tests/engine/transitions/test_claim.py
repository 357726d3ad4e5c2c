"""Claiming: registered (name, version) pairs, queues, priority, leases and fencing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

import tasks_engine
from tasks_engine import LeaseLostError, transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.runtime import executor
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def claim(*args) -> list[transitions.Lease]:
    return [c.lease for c in transitions.claim_runs(*args)]


def test_worker_claims_only_its_registered_pairs(fake_clock: FakeClock) -> None:
    a1 = tasks_engine.enqueue("a", version=1)
    a2 = tasks_engine.enqueue("a", version=2)
    b = tasks_engine.enqueue("b")
    assert drain(fake_clock, pairs=[("a", 1)]) == ["completed"]
    assert tasks_engine.get_run(a1.run_id).status == "completed"
    for other in (a2, b):
        view = tasks_engine.get_run(other.run_id)
        assert (view.status, view.attempts) == ("pending", 0)


def test_queue_filter() -> None:
    tasks_engine.enqueue("b", queue="io")
    assert claim("w", [("b", 1)], ["cpu"], 5, 30) == []
    assert len(claim("w", [("b", 1)], ["io"], 5, 30)) == 1


def test_higher_priority_is_claimed_first(fake_clock: FakeClock) -> None:
    low = tasks_engine.enqueue("b", priority=0)
    fake_clock.advance(1)
    high = tasks_engine.enqueue("b", priority=10)
    first = claim("w", [("b", 1)], None, 1, 30)
    assert [x.run_id for x in first] == [high.run_id]
    second = claim("w", [("b", 1)], None, 1, 30)
    assert [x.run_id for x in second] == [low.run_id]


def test_deferred_run_is_not_claimed_before_its_time(fake_clock: FakeClock) -> None:
    from datetime import timedelta

    later = fake_clock.now() + timedelta(seconds=60)
    tasks_engine.enqueue("b", available_at=later)
    assert claim("w", [("b", 1)], None, 1, 30) == []
    fake_clock.advance(61)
    assert len(claim("w", [("b", 1)], None, 1, 30)) == 1


def test_running_run_is_not_claimed_until_its_lease_expires(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("b")
    first = claim("w1", [("b", 1)], None, 1, 30)
    assert claim("w2", [("b", 1)], None, 1, 30) == []
    fake_clock.advance(31)
    second = claim("w2", [("b", 1)], None, 1, 30)
    assert [x.run_id for x in second] == [res.run_id]
    assert second[0].token != first[0].token
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.attempts, run.worker_id) == (2, "w2")


def test_stale_lease_cannot_write_anything(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("three_steps", {"n": 1})
    [old] = claim("w1", [("three_steps", 1)], None, 1, 30)
    step_id = transitions.start_step(old, "a", "function", 1, 1)
    fake_clock.advance(31)
    [new] = claim("w2", [("three_steps", 1)], None, 1, 30)
    with pytest.raises(LeaseLostError):
        transitions.finish_step(old, step_id, "completed", output={"x": 1})
    with pytest.raises(LeaseLostError):
        transitions.start_step(old, "b", "function", 1, 1)
    with pytest.raises(LeaseLostError):
        transitions.complete_run(old, "stale", [])
    with pytest.raises(LeaseLostError):
        transitions.fail_run(old, {"type": "x", "message": "y"})
    assert transitions.renew_leases([old], 30) == {}
    assert set(transitions.renew_leases([new], 30)) == {new.key}
    assert WorkflowRun.objects.get(pk=new.run_id).status == "running"


def test_expired_lease_not_taken_over_is_still_held(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b")
    [lease] = claim("w1", [("b", 1)], None, 1, 30)
    fake_clock.advance(120)  # expired, but nobody reclaimed it
    assert set(transitions.renew_leases([lease], 30)) == {lease.key}
    transitions.complete_run(lease, "late but fine", [])
    assert WorkflowRun.objects.get(pk=lease.run_id).status == "completed"


@pytest.mark.postgres_only("row locks: SQLite has one writer, and renewals wait for it")
@pytest.mark.django_db(transaction=True)
def test_a_locked_run_row_holds_up_no_renewal() -> None:
    """A fenced commit inside an atomic step locks its run's row until the step commits: the
    worker's one renewal statement waited for it, and every other lease it held lapsed."""
    from django.db import connection, transaction

    tasks_engine.enqueue("b")
    tasks_engine.enqueue("b")
    locked, free = claim("w1", [("b", 1)], None, 2, 30)
    before = WorkflowRun.objects.get(pk=locked.run_id).available_at
    taken, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        with transaction.atomic():
            assert transitions.lock_held_run(locked)
            taken.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert taken.wait(10)
        renewed = transitions.renew_leases([locked, free], 60)  # waited here for the lock
        assert renewed[locked.key].locked and not renewed[free.key].locked
        assert WorkflowRun.objects.get(pk=locked.run_id).available_at == before
    finally:
        release.set()
        holder.join(10)
    assert not transitions.renew_leases([locked], 60)[locked.key].locked
    assert WorkflowRun.objects.get(pk=locked.run_id).available_at > before


def test_reclaim_closes_interrupted_attempts_as_abandoned_and_counts_them(
    fake_clock: FakeClock,
) -> None:
    res = tasks_engine.enqueue("flaky", {"fail_times": 0})
    [old] = claim("w1", [("flaky", 1)], None, 1, 30)
    transitions.start_step(old, "body", "function", 1, 1)  # then the worker "dies"
    fake_clock.advance(31)
    drain(fake_clock)
    steps = list(StepAttempt.objects.filter(run_id=res.run_id).order_by("id"))
    assert [(s.attempt, s.status, s.counted) for s in steps] == [
        (1, "abandoned", True),
        (2, "completed", True),
    ]
    assert tasks_engine.get_run(res.run_id).status == "completed"


def test_step_interrupted_every_time_fails_the_run(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("flaky", {"fail_times": 0})
    for i in range(3):  # max_attempts=3: three crashes (each restart is a new worker id)
        [lease] = claim(f"w{i}", [("flaky", 1)], None, 1, 30)
        run = WorkflowRun.objects.get(pk=res.run_id)
        executor.build_context(run, lease, threading.Event())  # closes the previous attempt
        n = StepAttempt.objects.filter(run_id=res.run_id).count()
        transitions.start_step(lease, "body", "function", n + 1, 1)
        fake_clock.advance(31)
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.StepFailedError"
    assert [s.status for s in view.steps] == ["abandoned"] * 3 + ["failed"]
    assert (
        view.steps[-1].error["message"] == "step 'body' was interrupted 3 times without finishing"
    )


def test_an_attempt_the_reclaiming_worker_itself_left_does_not_count(
    fake_clock: FakeClock,
) -> None:
    """The same worker takes its run again after its lease expired in an outage: it is alive,
    so the attempt it left was cut short by the outage, not by the step, and does not count.
    Three such losses do not fail the step; another worker's reclaim does count."""
    res = tasks_engine.enqueue("flaky", {"fail_times": 0})
    for n in range(3):
        [lease] = claim("w-alive", [("flaky", 1)], None, 1, 30)
        run = WorkflowRun.objects.get(pk=res.run_id)
        executor.build_context(run, lease, threading.Event())  # closes the previous attempt
        transitions.start_step(lease, "body", "function", n + 1, 1)
        fake_clock.advance(31)
    [lease] = claim("w-other", [("flaky", 1)], None, 1, 30)
    executor.build_context(WorkflowRun.objects.get(pk=res.run_id), lease, threading.Event())
    steps = StepAttempt.objects.filter(run_id=res.run_id).order_by("attempt")
    assert [(s.attempt, s.status, s.counted) for s in steps] == [
        (1, "abandoned", False),
        (2, "abandoned", False),
        (3, "abandoned", True),
    ]


def test_graceful_handback_does_not_count(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("flaky", {"fail_times": 0})
    [lease] = claim("w", [("flaky", 1)], None, 1, 30)
    transitions.start_step(lease, "body", "function", 1, 1)
    transitions.requeue_run(lease, fake_clock.now())
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.lease_token) == ("pending", None)
    step = StepAttempt.objects.get(run_id=res.run_id)
    assert (step.status, step.counted) == ("abandoned", False)
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).status == "completed"


def test_renewal_reports_cancel_and_deadline_only_when_set(fake_clock: FakeClock) -> None:
    """SQLite folded `cancel_requested_at IS NOT NULL` in RETURNING to true: every renewal
    reported a cancel, and every step longer than a heartbeat was canceled."""
    plain = tasks_engine.enqueue("b").run_id
    later = tasks_engine.enqueue("b", deadline_at=fake_clock.now() + timedelta(hours=1)).run_id
    due = tasks_engine.enqueue("b", deadline_at=fake_clock.now() + timedelta(seconds=5)).run_id
    leases = {c.run_id: c for c in claim("w", [("b", 1)], None, 3, 30)}
    canceled = tasks_engine.enqueue("b").run_id
    [leases[canceled]] = claim("w", [("b", 1)], None, 1, 30)
    tasks_engine.cancel(canceled, "by hand")
    fake_clock.advance(10)
    renewed = transitions.renew_leases(list(leases.values()), 30)
    found = {run: renewed[lease.key] for run, lease in leases.items()}
    assert found[plain] == transitions.Renewal(cancel_requested=False, deadline_passed=False)
    assert found[later] == transitions.Renewal(cancel_requested=False, deadline_passed=False)
    assert found[due] == transitions.Renewal(cancel_requested=False, deadline_passed=True)
    assert found[canceled] == transitions.Renewal(cancel_requested=True, deadline_passed=False)
    expiry = WorkflowRun.objects.get(pk=plain).available_at
    assert expiry == fake_clock.now() + timedelta(seconds=30)


def test_a_stale_lease_is_not_renewed_beside_the_fresh_one(fake_clock: FakeClock) -> None:
    """Found by the simulation: `id IN (...) AND lease_token IN (...)` renewed a stale lease
    whenever the same worker also held the run's fresh one."""
    tasks_engine.enqueue("b")
    [stale] = claim("w", [("b", 1)], None, 1, 30)
    fake_clock.advance(31)
    [fresh] = claim("w", [("b", 1)], None, 1, 30)
    renewed = transitions.renew_leases([stale, fresh], 30)
    assert set(renewed) == {fresh.key}  # and not the stale lease's


def test_renewals_are_keyed_by_run_and_lease_token(fake_clock: FakeClock) -> None:
    """A stale and a fresh lease of one run, renewed together (the worker whose lease expired
    during an outage while its slot still executes, and the run's next attempt): the result
    names each lease renewed by (run, token), so the stale one is never taken for the fresh
    one, nor told what the fresh one was told."""
    run_id = tasks_engine.enqueue("b").run_id
    [stale] = claim("w", [("b", 1)], None, 1, 30)
    fake_clock.advance(31)
    [fresh] = claim("w", [("b", 1)], None, 1, 30)
    tasks_engine.cancel(run_id, "by hand")
    renewed = transitions.renew_leases([fresh, stale], 30)
    assert stale.run_id == fresh.run_id and stale.key != fresh.key
    assert renewed == {fresh.key: transitions.Renewal(cancel_requested=True, deadline_passed=False)}
    assert stale.key not in renewed
    # Alone, the stale lease renews nothing; the fresh one still renews.
    assert transitions.renew_leases([stale], 30) == {}
    assert set(transitions.renew_leases([fresh], 30)) == {fresh.key}
