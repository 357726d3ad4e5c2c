"""Queues at runtime, in-process on both databases: a paused queue's pending runs and due
timers are claimed by no claim (plain, guarded, burst probe), its running runs go on, its
enqueues are accepted; resume; limit overrides (queues/)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.models import Queue, WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.services import paused_timers
from tasks_engine.transitions import claim_mode, queue_state
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

PAIRS = [("b", 1), ("sleeper", 1), ("flow-plain", 1), ("flow-disk", 1)]


def claim(n: int = 10, lease: float = 600.0) -> list[transitions.Claimed]:
    return transitions.claim_runs("w", PAIRS, None, n, lease)


def queues_of(claimed: list[transitions.Claimed]) -> list[str]:
    return sorted(c.run.queue for c in claimed)


def finish(claimed: list[transitions.Claimed]) -> None:
    for c in claimed:
        wf, ctx = executor.build_context(c.run, c.lease, threading.Event(), c.prestarted)
        executor.execute(c.run, wf, ctx)


def test_pause_and_resume_answer_whether_they_changed_anything() -> None:
    assert tasks_engine.pause_queue("q", reason="disk full") is True
    assert tasks_engine.pause_queue("q", reason="again") is False
    row = Queue.objects.get(name="q")
    assert row.paused and row.reason == "disk full" and row.paused_at is not None
    assert tasks_engine.resume_queue("q") is True
    assert tasks_engine.resume_queue("q") is False
    assert tasks_engine.resume_queue("never-paused") is False
    assert not Queue.objects.filter(name="never-paused").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda: tasks_engine.pause_queue(""),
        lambda: tasks_engine.pause_queue("x" * 101),
        lambda: tasks_engine.pause_queue("a\x00b"),
        lambda: tasks_engine.pause_queue(3),  # type: ignore[arg-type]
        lambda: tasks_engine.pause_queue("q", reason="r\x00"),
        lambda: tasks_engine.resume_queue(""),
        lambda: tasks_engine.set_queue_limits("q", concurrency=0),
        lambda: tasks_engine.set_queue_limits("q", concurrency=True),  # type: ignore[arg-type]
        lambda: tasks_engine.set_queue_limits("q", rate_limit="30 per minute"),
        lambda: tasks_engine.set_queue_limits("q", rate_limit="0/s"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(call: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        call()
    assert Queue.objects.count() == 0


def test_a_paused_queues_runs_wait_and_other_queues_go_on() -> None:
    tasks_engine.pause_queue("slow")
    held = tasks_engine.enqueue("b", {}, queue="slow", priority=9)  # accepted while paused
    other = tasks_engine.enqueue("b", {}, queue="fast")
    got = claim()
    assert [c.run.pk for c in got] == [other.run_id]
    assert WorkflowRun.objects.get(pk=held.run_id).status == "pending"
    assert claim() == []
    tasks_engine.resume_queue("slow")
    assert [c.run.pk for c in claim()] == [held.run_id]


def test_a_pause_from_another_process_reaches_the_claim_once_the_snapshot_is_read_again(
    settings: Any,
) -> None:
    """A row written by someone else (not through this process's pause_queue): seen as soon
    as the snapshot is half a poll interval old, without being told."""
    tasks_engine.enqueue("b", {}, queue="slow")
    queue_state.current()  # this process's snapshot: nothing paused
    Queue.objects.create(name="slow", paused=True, updated_at=clock.now())
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "POLL_INTERVAL": 0.0}
    assert claim() == []


def test_the_guarded_claim_leaves_a_paused_queue_out(settings: Any) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"flow-io": {"concurrency": 5}}}
    tasks_engine.pause_queue("flow-io")
    tasks_engine.pause_queue("keyed")
    tasks_engine.enqueue("flow-plain", {})  # queue flow-io: limited, paused
    tasks_engine.enqueue("flow-disk", {"disk": "a"}, queue="keyed")  # keyed, paused
    free = tasks_engine.enqueue("flow-disk", {"disk": "b"}).run_id  # keyed, not paused
    assert claim_mode.guarded(PAIRS, None)
    assert [c.run.pk for c in claim()] == [free]
    tasks_engine.resume_queue("flow-io")
    tasks_engine.resume_queue("keyed")
    assert queues_of(claim()) == ["flow-io", "keyed"]
    claim_mode.forget_keyed()


def test_running_runs_go_on_and_an_expired_lease_is_taken_back(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b", {}, queue="slow")
    [first] = claim(lease=5.0)
    tasks_engine.pause_queue("slow")
    fake_clock.advance(10)  # its worker died: the lease expired
    [again] = claim()
    assert again.run.pk == first.run.pk  # a running run goes on
    finish([again])
    assert WorkflowRun.objects.get(pk=first.run.pk).status == "completed"


def test_a_due_timer_of_a_paused_queue_waits_as_pending(fake_clock: FakeClock) -> None:
    run = tasks_engine.enqueue("sleeper", {"seconds": 60}, queue="slow").run_id
    finish(claim())
    assert WorkflowRun.objects.get(pk=run).status == "waiting"
    tasks_engine.pause_queue("slow")
    fake_clock.advance(61)
    assert claim() == []  # the due timer is not claimed
    assert paused_timers.run_once() == 1  # the leader's service
    assert WorkflowRun.objects.get(pk=run).status == "pending"
    assert claim() == [] and paused_timers.run_once() == 0
    tasks_engine.resume_queue("slow")
    finish(claim())
    assert WorkflowRun.objects.get(pk=run).status == "completed"


def test_a_burst_worker_does_not_wait_for_a_paused_queue() -> None:
    tasks_engine.enqueue("b", {}, queue="slow")
    horizon = clock.now() + timedelta(seconds=60)
    assert transitions.anything_due_before(PAIRS, None, horizon)
    tasks_engine.pause_queue("slow")
    assert not transitions.anything_due_before(PAIRS, None, horizon)


def test_a_concurrency_override_limits_a_queue_the_settings_do_not() -> None:
    for _ in range(3):
        tasks_engine.enqueue("b", {}, queue="tuned")
    assert tasks_engine.set_queue_limits("tuned", concurrency=1) == (1, "")
    assert len(claim()) == 1
    assert tasks_engine.set_queue_limits("tuned", concurrency=None) == (None, "")
    assert len(claim()) == 2


def test_a_lowered_override_never_over_admits_even_before_the_snapshot_is_read(
    settings: Any,
) -> None:
    """The guarded claim reads the queue's row under its lock: a limit lowered from 4 to 1
    with 3 running admits nothing, though this process still holds the snapshot with 4."""
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"flow-io": {"concurrency": 4}}}
    for _ in range(6):
        tasks_engine.enqueue("flow-plain", {})
    assert len(claim(3)) == 3
    queue_state.current()  # limits 4 in this process's snapshot
    Queue.objects.create(name="flow-io", concurrency=1, updated_at=clock.now())
    assert claim() == []
    assert claim_mode.limited_queues(None)["flow-io"].concurrency == 4  # the snapshot lags
    Queue.objects.filter(name="flow-io").update(concurrency=5)
    assert len(claim()) == 2


def test_list_queues_shows_settings_workflows_rows_and_counts(settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "QUEUES": {"flow-io": {"concurrency": 2, "rate_limit": "30/m"}},
    }
    tasks_engine.enqueue("b", {}, queue="busy")
    tasks_engine.pause_queue("idle", reason="maintenance")
    tasks_engine.set_queue_limits("flow-io", rate_limit="5/s")
    views = {v.name: v for v in tasks_engine.list_queues()}
    assert {"busy", "idle", "flow-io", "default"} <= set(views)
    assert views["busy"].pending == 1 and not views["busy"].paused
    assert views["idle"].paused and views["idle"].reason == "maintenance"
    io = views["flow-io"]
    assert (io.concurrency, io.rate_limit, io.overridden) == (2, "5/s", ("rate_limit",))
    assert views["idle"].to_dict()["paused_at"] is not None
