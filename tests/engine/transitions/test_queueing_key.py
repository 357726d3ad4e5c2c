"""A queueing key: at most one queued run per key (docs/FLOW_CONTROL.md, "One queued run per
key"). While a run with the key waits to start for the first time, an enqueue with the key
answers that run and writes nothing; once it has started, the next enqueue queues a new one."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.definitions import workflow
from tasks_engine.models import WorkflowRun
from tests.engine.transitions.test_flow_control import claim, finish
from tests.engine.transitions.test_flow_race import in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_queued_runs_key_answers_that_run_and_writes_nothing() -> None:
    first = tasks_engine.enqueue("b", queueing_key="scan")
    again = tasks_engine.enqueue("b", {}, queueing_key="scan", priority=5)
    assert not first.deduplicated
    assert again.deduplicated and again.run_id == first.run_id
    assert WorkflowRun.objects.count() == 1
    assert WorkflowRun.objects.get().priority == 0  # the queued run is unchanged
    assert tasks_engine.get_run(first.run_id).queueing_key == "scan"


def test_the_key_is_fleet_wide_across_workflows_and_other_keys_queue() -> None:
    first = tasks_engine.enqueue("b", queueing_key="scan")
    assert tasks_engine.enqueue("flow-plain", {}, queueing_key="scan").run_id == first.run_id
    other = tasks_engine.enqueue("b", queueing_key="other")
    plain = tasks_engine.enqueue("b")
    assert len({first.run_id, other.run_id, plain.run_id}) == 3


def test_once_the_run_starts_the_next_enqueue_queues_a_new_one() -> None:
    first = tasks_engine.enqueue("b", queueing_key="scan").run_id
    [started] = claim(1)
    assert started.lease.run_id == first
    second = tasks_engine.enqueue("b", queueing_key="scan")
    assert not second.deduplicated and second.run_id != first
    assert tasks_engine.enqueue("b", queueing_key="scan").run_id == second.run_id
    # Handed back to pending (a stopping worker, an outage): it has started, so it holds no
    # place in the key and the queued one keeps it.
    transitions.requeue_run(started.lease, clock.now())
    assert WorkflowRun.objects.get(pk=first).status == "pending"
    assert tasks_engine.enqueue("b", queueing_key="scan").run_id == second.run_id
    finish(claim(5))
    assert not tasks_engine.enqueue("b", queueing_key="scan").deduplicated


def test_a_workflow_declares_the_key_as_a_callable_of_its_input() -> None:
    a = tasks_engine.enqueue("flow-scan", {"disk": "a"})
    assert tasks_engine.get_run(a.run_id).queueing_key == "scan:a"
    assert tasks_engine.enqueue("flow-scan", {"disk": "a", "seconds": 1}).run_id == a.run_id
    assert not tasks_engine.enqueue("flow-scan", {"disk": "b"}).deduplicated
    # An enqueue's key overrides the workflow's.
    assert not tasks_engine.enqueue("flow-scan", {"disk": "a"}, queueing_key="x").deduplicated


def test_a_canceled_queued_run_frees_the_key() -> None:
    first = tasks_engine.enqueue("b", queueing_key="scan").run_id
    assert tasks_engine.cancel(first)
    assert tasks_engine.enqueue("b", queueing_key="scan").run_id != first


def test_an_operator_retry_of_a_run_that_never_started_takes_no_place_in_the_key() -> None:
    """A retried run is the operator's, not a request to merge: it neither collides with the
    queued run nor answers for the key."""
    first = tasks_engine.enqueue("b", queueing_key="scan").run_id
    assert tasks_engine.cancel(first)  # canceled while pending: it never started
    queued = tasks_engine.enqueue("b", queueing_key="scan").run_id
    assert tasks_engine.retry_run(first)
    assert set(WorkflowRun.objects.values_list("status", flat=True)) == {"pending"}
    assert tasks_engine.enqueue("b", queueing_key="scan").run_id == queued


def test_with_an_idempotency_key_the_taken_idempotency_key_answers_first() -> None:
    keyed = tasks_engine.enqueue("b", idempotency_key="i1").run_id
    queued = tasks_engine.enqueue("b", queueing_key="scan").run_id
    again = tasks_engine.enqueue("b", idempotency_key="i1", queueing_key="scan")
    assert again.deduplicated and again.run_id == keyed
    merged = tasks_engine.enqueue("b", idempotency_key="i2", queueing_key="scan")
    assert merged.deduplicated and merged.run_id == queued
    assert WorkflowRun.objects.count() == 2


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("", ValueError),
        ("k" * 256, ValueError),
        ("a\x00b", ValueError),
        (5, ValueError),
    ],
)
def test_a_bad_key_is_refused_and_writes_nothing(key: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="queueing_key"):
        tasks_engine.enqueue("b", queueing_key=key)
    assert not WorkflowRun.objects.exists()


def test_a_bad_declared_key_is_refused_at_definition() -> None:
    with pytest.raises(TypeError, match="queueing_key"):
        workflow(name="never-registered", queueing_key="")(lambda ctx: None)


def test_enqueues_racing_on_their_own_connections_make_one_run() -> None:
    n = 8
    barrier = threading.Barrier(n, timeout=30)
    got: list[Any] = []

    def enqueue(_i: int) -> None:
        barrier.wait()
        got.append(tasks_engine.enqueue("b", queueing_key="scan"))

    assert in_threads(enqueue, n, 60, barrier) == []
    assert WorkflowRun.objects.count() == 1
    assert {r.run_id for r in got} == {WorkflowRun.objects.get().pk}
    assert sorted(r.deduplicated for r in got) == [False] + [True] * (n - 1)
