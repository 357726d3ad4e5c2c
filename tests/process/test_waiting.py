"""Waiting and control with real workers: wake-ups (NOTIFY on PostgreSQL, polling on SQLite),
cancel, durable sleep, children."""

from __future__ import annotations

import signal
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import Fact, StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.models import SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # wake-ups (NOTIFY or polling), wake times on the database's clock
]


def idle() -> tuple[str, ...]:
    """On PostgreSQL a slow poll, so that prompt reactions can only come from NOTIFY; SQLite has
    no NOTIFY and polls: a short poll there."""
    return (
        ("--poll-interval", "5")
        if connection.vendor == "postgresql"
        else ("--poll-interval", "0.2")
    )


def cancel_reach() -> tuple[str, ...]:
    """A cancel reaches a running step by NOTIFY on PostgreSQL, by the next heartbeat on SQLite:
    a short lease there, so that the heartbeat (lease / 3) comes every second."""
    return () if connection.vendor == "postgresql" else ("--lease-seconds", "3")


def status(run_id) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def is_completed(run_id) -> bool:
    return status(run_id) == "completed"


def listening(worker) -> None:
    """Wait until the worker is serving: on PostgreSQL, until it listens for wake-ups."""
    if connection.vendor == "postgresql":
        wait_for(lambda: "listening for wake-ups" in worker.log(), 30, "the worker to LISTEN")
    else:
        wait_for(lambda: "worker started" in worker.log(), 30, "the worker to start")


@pytest.mark.postgres_only("NOTIFY pickup latency (SQLite polls)")
def test_enqueued_run_starts_promptly_on_an_idle_worker(workers) -> None:
    w = workers(*idle())
    listening(w)
    res = tasks_engine.enqueue("b")
    wait_for(lambda: status(res.run_id) == "completed", 10, "the run to complete")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.started_at - run.created_at < timedelta(seconds=1)


def test_fact_signalled_while_waiting_wakes_the_run_without_a_poll(workers) -> None:
    w = workers(*idle())
    listening(w)
    res = tasks_engine.enqueue("fact_waiter", {"count": 1})
    wait_for(lambda: status(res.run_id) == "waiting", 10, "the run to park")
    tasks_engine.signal(res.run_id, "item", {"hello": "world"})
    wait_for(lambda: status(res.run_id) == "completed", 10, "the run to complete")
    fact = Fact.objects.get(run_id=res.run_id)
    step = StepAttempt.objects.get(run_id=res.run_id, name="item")
    assert step.finished_at - fact.created_at < timedelta(seconds=1)
    assert tasks_engine.get_run(res.run_id).output == [{"hello": "world"}]


def test_cancel_reaches_a_step_looping_on_the_abort_signal(workers) -> None:
    w = workers(*idle(), *cancel_reach())
    listening(w)
    res = tasks_engine.enqueue("abortable")
    wait_for(lambda: SideEffect.objects.filter(key="loop-start").exists(), 10, "the loop")
    assert tasks_engine.cancel(res.run_id, "operator said so") is True
    wait_for(lambda: status(res.run_id) == "canceled", 5, "the run to end canceled")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.cancel_reason == "operator said so"
    assert run.finished_at - run.cancel_requested_at < timedelta(seconds=3)
    assert not SideEffect.objects.filter(key="next").exists()
    assert not StepAttempt.objects.filter(run_id=res.run_id, status="running").exists()
    assert tasks_engine.signal(res.run_id, "x") == tasks_engine.Signaled(False, "canceled")
    assert tasks_engine.cancel(res.run_id) is False


def test_sigkill_while_sleeping_keeps_the_wake_time(workers) -> None:
    res = tasks_engine.enqueue("sleeper", {"seconds": 4})
    first = workers("--poll-interval", "0.2", tag="first")
    wait_for(lambda: status(res.run_id) == "waiting", 10, "the run to sleep")
    wake_at = WorkflowRun.objects.get(pk=res.run_id).available_at
    first.send(signal.SIGKILL)
    first.wait(10)
    assert WorkflowRun.objects.get(pk=res.run_id).available_at == wake_at
    workers("--poll-interval", "0.2", tag="second")
    wait_for(lambda: status(res.run_id) == "completed", 20, "the run to complete")
    after = SideEffect.objects.get(run_id=res.run_id, key="after")
    assert after.created_at >= wake_at
    assert after.created_at - wake_at < timedelta(seconds=3)
    assert SideEffect.objects.filter(run_id=res.run_id, key="before").count() == 1


def test_parent_and_child_across_workers_and_cancel_cascade(workers) -> None:
    workers("--poll-interval", "0.2", "--concurrency", "2")
    ok = tasks_engine.enqueue("parent", {"value": 5})
    wait_for(lambda: status(ok.run_id) == "completed", 20, "the parent to complete")
    assert tasks_engine.get_run(ok.run_id).output == {"child": {"double": 10}}

    slow = tasks_engine.enqueue("parent", {"value": 1, "sleep": 600})
    wait_for(lambda: status(slow.run_id) == "waiting", 20, "the parent to wait on its child")
    child = WorkflowRun.objects.get(parent_run_id=slow.run_id)
    wait_for(lambda: status(child.pk) == "waiting", 20, "the child to sleep")
    assert tasks_engine.cancel(slow.run_id) is True
    assert status(slow.run_id) == "canceled"
    assert status(child.pk) == "canceled"


def test_cancel_of_a_step_that_ignores_its_abort_ends_the_run_after_the_grace(workers) -> None:
    w = workers("--lease-seconds", "2", "--concurrency", "1", "--poll-interval", "0.2")
    listening(w)
    res = tasks_engine.enqueue("stubborn")
    wait_for(lambda: SideEffect.objects.filter(key="stubborn-start").exists(), 10, "the step")
    tasks_engine.cancel(res.run_id, "stuck")
    wait_for(lambda: status(res.run_id) == "canceled", 10, "the run to be written off")
    assert not StepAttempt.objects.filter(run_id=res.run_id, status="running").exists()
    # The one slot was handed to a new thread: the worker still serves runs.
    other = tasks_engine.enqueue("b")
    wait_for(lambda: status(other.run_id) == "completed", 10, "another run on the same worker")
    assert not SideEffect.objects.filter(key="after").exists()


def test_a_finished_step_is_checkpointed_even_when_the_next_write_is_far_off(workers) -> None:
    workers("--poll-interval", "0.2")
    res = tasks_engine.enqueue("slow_between_steps")
    wait_for(lambda: SideEffect.objects.filter(key="between").exists(), 10, "the gap")
    wait_for(
        lambda: StepAttempt.objects.filter(run_id=res.run_id, name="first", status="completed"),
        2.5,
        "the heartbeat to send the deferred checkpoint",
    )
    assert status(res.run_id) == "running"
    wait_for(lambda: status(res.run_id) == "completed", 15, "the run to complete")


def test_parents_whose_children_finish_while_they_park_are_all_woken(workers) -> None:
    """A child that ends while its parent is still parking must not be missed (the parent
    reads the child's status under its own row lock, and a child's end takes that lock).
    One parent at a time on two slots: the child starts on the other slot at once and often
    finishes within the parent's parking window; a missed wake-up is never rescued (a parent
    waiting on a child has no timer)."""
    w = workers(*idle(), "--concurrency", "2")
    listening(w)
    for i in range(15):
        run_id = tasks_engine.enqueue("parent", {"value": i}).run_id
        wait_for(partial(is_completed, run_id), 5, f"parent {i} to complete")
