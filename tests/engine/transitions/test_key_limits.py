"""What a full concurrency key does (`on_limit`) and rate limits per key (`rate_limit` +
`rate_limit_key`), in-process on both databases (docs/FLOW_CONTROL.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import tasks_engine
from tasks_engine import transitions
from tasks_engine.definitions import workflow
from tasks_engine.models import RateKeyLog, WorkflowRun
from tasks_engine.transitions import claim_mode
from tests.engine.transitions.test_flow_control import finish, limit_queues
from tests.engine.transitions.test_flow_race import in_threads
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db(transaction=True)

PAIRS = [("flow-cancel-new", 1), ("flow-cancel-running", 1), ("flow-key-rate", 1), ("b", 1)]


@pytest.fixture(autouse=True)
def _plain_claims_after() -> Iterator[None]:
    yield
    claim_mode.forget_keyed()


def claim(n: int = 10, worker: str = "w") -> list[transitions.Claimed]:
    return transitions.claim_runs(worker, PAIRS, None, n, 600.0)


def status(run_id: Any) -> str:
    return str(WorkflowRun.objects.get(pk=run_id).status)


# -- on_limit ---------------------------------------------------------------------------------


def test_cancel_new_ends_the_new_run_canceled_at_once_and_returns_its_id() -> None:
    first = tasks_engine.enqueue("flow-cancel-new", {"disk": "a"})
    second = tasks_engine.enqueue("flow-cancel-new", {"disk": "a"})  # a pending run is full
    assert not second.deduplicated and second.run_id != first.run_id
    run = WorkflowRun.objects.get(pk=second.run_id)
    assert run.status == "canceled" and run.finished_at is not None
    assert "cancel_new" in run.cancel_reason and "new:a" in run.cancel_reason
    assert status(first.run_id) == "pending"
    other = tasks_engine.enqueue("flow-cancel-new", {"disk": "b"})  # another key has room
    assert status(other.run_id) == "pending"
    [started_a, _started_b] = sorted(claim(), key=lambda c: str(c.run.concurrency_key))
    assert tasks_engine.enqueue("flow-cancel-new", {"disk": "a"}).run_id  # running: full
    assert WorkflowRun.objects.filter(status="canceled").count() == 2
    finish([started_a])
    assert status(tasks_engine.enqueue("flow-cancel-new", {"disk": "a"}).run_id) == "pending"


def test_cancel_running_cancels_the_oldest_and_the_new_run_takes_its_place() -> None:
    one = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    two = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    started = claim()
    assert {c.run.pk for c in started} == {one, two}  # limit 2
    three = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    oldest = WorkflowRun.objects.get(pk=one)
    assert oldest.status == "running" and oldest.cancel_requested_at is not None
    assert str(three) in oldest.cancel_reason and "cancel_running" in oldest.cancel_reason
    assert WorkflowRun.objects.get(pk=two).cancel_requested_at is None
    assert claim() == []  # the asked run keeps its place until it has stopped
    finish(started)
    assert status(one) == "canceled" and status(two) == "completed"
    [taken] = claim()
    assert taken.run.pk == three


def test_cancel_running_cancels_a_pending_run_that_holds_the_place() -> None:
    one = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    two = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    three = tasks_engine.enqueue("flow-cancel-running", {"disk": "a"}).run_id
    assert status(one) == "canceled" and status(two) == "pending" and status(three) == "pending"


def test_cancel_new_enqueues_racing_on_their_own_connections_queue_at_most_the_limit() -> None:
    n = 8
    barrier = threading.Barrier(n, timeout=30)

    def enqueue(_i: int) -> None:
        barrier.wait()
        tasks_engine.enqueue("flow-cancel-new", {"disk": "a"})

    assert in_threads(enqueue, n, 60, barrier) == []
    assert WorkflowRun.objects.filter(status="pending").count() == 1
    assert WorkflowRun.objects.filter(status="canceled").count() == n - 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"on_limit": "drop"}, ValueError, "on_limit must be one of"),
        ({"on_limit": 1}, TypeError, "on_limit must be a string"),
        ({"on_limit": "cancel_new"}, ValueError, "needs a concurrency_key"),
        ({"rate_limit": "10/m"}, ValueError, "needs a rate_limit_key"),
        ({"rate_limit_key": "k"}, ValueError, "needs rate_limit="),
        ({"rate_limit": "ten", "rate_limit_key": "k"}, ValueError, "rate_limit"),
        ({"rate_limit": "0/m", "rate_limit_key": "k"}, ValueError, "rate_limit"),
        ({"rate_limit": "1/m", "rate_limit_key": 3}, TypeError, "rate_limit_key"),
        (
            {"rate_limit": "1/m", "rate_limit_key": "k", "concurrency_key": "c"},
            ValueError,
            "cannot be combined",
        ),
    ],
)
def test_bad_definitions_are_refused_where_the_workflow_is_defined(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        workflow(name="never-registered-limits", **kwargs)(lambda ctx: None)


def test_bad_enqueues_are_refused_and_write_nothing() -> None:
    with pytest.raises(ValueError, match="cannot be given"):
        tasks_engine.enqueue("flow-key-rate", {"disk": "a"}, concurrency_key="c")
    with pytest.raises(ValueError, match="rate_limit_key"):
        tasks_engine.enqueue("flow-key-rate", {"disk": ""})  # the key callable gives ""
    assert not WorkflowRun.objects.exists()


# -- rate limits per key ----------------------------------------------------------------------


def test_a_key_starts_at_most_n_runs_per_window_and_other_keys_are_not_held_back(
    fake_clock: FakeClock,
) -> None:
    for _ in range(5):
        tasks_engine.enqueue("flow-key-rate", {"disk": "a"})
    for _ in range(2):
        tasks_engine.enqueue("flow-key-rate", {"disk": "b"})
    plain = tasks_engine.enqueue("b").run_id
    first = claim()
    by_key = sorted(str(c.run.input["disk"]) for c in first if c.run.task_name != "b")
    assert by_key == ["a", "a", "b", "b"]  # 2/s each
    assert plain in {c.run.pk for c in first}  # the plain run beside them
    assert claim() == []
    assert WorkflowRun.objects.get(pk=first[0].run.pk).rate_key in {"a", "b"}
    fake_clock.advance(0.5)
    assert claim() == []  # still inside the window
    fake_clock.advance(0.51)
    assert sorted(str(c.run.input["disk"]) for c in claim()) == ["a", "a"]
    fake_clock.advance(1.01)
    assert [str(c.run.input["disk"]) for c in claim()] == ["a"]
    assert len(RateKeyLog.objects.get(key="a").times) == 2  # the last N kept


def test_the_window_slides(fake_clock: FakeClock) -> None:
    for _ in range(4):
        tasks_engine.enqueue("flow-key-rate", {"disk": "a"})
    assert len(claim(1)) == 1
    fake_clock.advance(0.6)
    assert len(claim(5)) == 1  # 2 in the window ending now
    fake_clock.advance(0.5)  # the first left the window, the second has not
    assert len(claim(5)) == 1
    assert claim(5) == []


def test_claims_racing_on_their_own_connections_never_exceed_the_rate() -> None:
    """Each claim reads a dozen candidates: with 120 runs pending, six claims of one place
    each lock candidates of their own, and only the key's row serialises them."""
    tasks_engine.enqueue_many("flow-key-rate", [{"disk": "a"}] * 120)
    n = 6
    barrier = threading.Barrier(n, timeout=30)
    got: list[Any] = []

    def take(i: int) -> None:
        barrier.wait()
        for _ in range(3):
            got.extend(claim(1, worker=f"w{i}"))

    assert in_threads(take, n, 60, barrier) == []
    starts = sorted(c.run.started_at for c in got)
    assert len(starts) >= 2
    # 2/s: any three claims span at least a second (the claims' own clock, as the key's row
    # records it)
    for first, third in zip(starts, starts[2:], strict=False):
        assert (third - first).total_seconds() >= 1.0, starts


def test_a_limited_queue_still_holds_for_rate_keyed_runs(settings: Any) -> None:
    limit_queues(settings, {"default": {"concurrency": 1}})
    for disk in "abc":
        tasks_engine.enqueue("flow-key-rate", {"disk": disk})
    assert len(claim()) == 1


def test_a_worker_that_never_enqueued_learns_of_rate_keyed_runs() -> None:
    tasks_engine.enqueue("flow-key-rate", {"disk": "a"})
    claim_mode.forget_keyed()
    claim_mode.refresh()
    assert claim_mode.rate_keyed_seen()
    assert len(claim()) == 1


def test_retention_deletes_the_rows_of_keys_idle_past_the_longest_window(
    fake_clock: FakeClock,
) -> None:
    from tasks_engine.services import retention

    tasks_engine.enqueue("flow-key-rate", {"disk": "a"})
    finish(claim())
    fake_clock.advance(1800)
    tasks_engine.enqueue("flow-key-rate", {"disk": "b"})
    finish(claim())
    # `prune --older-than 0` still keeps a row whose newest claim is inside an hour.
    assert retention.prune(timedelta(0))["rate_keys"] == 0
    fake_clock.advance(1801)
    assert retention.prune(timedelta(0))["rate_keys"] == 1
    assert list(RateKeyLog.objects.values_list("key", flat=True)) == ["b"]


def test_drain_with_a_fake_clock_jumps_over_a_keys_window(fake_clock: FakeClock) -> None:
    from tasks_engine.testing import drain

    start = fake_clock.now()
    for _ in range(5):
        tasks_engine.enqueue("flow-key-rate", {"disk": "a"})
    assert drain(fake_clock, pairs=[("flow-key-rate", 1)]) == ["completed"] * 5
    assert start + timedelta(seconds=2) <= fake_clock.now() < start + timedelta(seconds=3)


def test_enqueue_many_applies_the_strategy_in_input_order() -> None:
    got = tasks_engine.enqueue_many("flow-cancel-new", [{"disk": "a"}] * 3 + [{"disk": "b"}])
    assert [status(g.run_id) for g in got] == ["pending", "canceled", "canceled", "pending"]
    got = tasks_engine.enqueue_many("flow-cancel-running", [{"disk": "a"}] * 3)
    assert [status(g.run_id) for g in got] == ["canceled", "pending", "pending"]
