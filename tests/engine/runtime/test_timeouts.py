"""Step timeouts, default deadlines and run_child timeouts, in-process with a fake clock.

The heartbeat fires step timers in a worker; here the step body plays the heartbeat (it fires
its own timer), so the step API's side is tested on its own (tests/process/test_timeouts.py
runs the real heartbeat).
"""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest

import tasks_engine
from tasks_engine import StepTimeoutError, clock, transitions
from tasks_engine.definitions import registry
from tasks_engine.exceptions import TasksEngineError
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.runtime.context import AbortSignal
from tasks_engine.runtime.step_timeouts import StepTimer, WriteOff, timeout_seconds
from tasks_engine.testing import tester
from tasks_engine.values.durations import MAX_DURATION
from tests.helpers import FakeClock, drain
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


def steps(run_id) -> list[tuple[str, str, int, str]]:
    return list(
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("name", "status", "attempt", "error__type")
    )


TIMEOUT = "tasks_engine.exceptions.StepTimeoutError"


def test_step_timeout_error_is_exported_and_an_engine_error() -> None:
    assert issubclass(tasks_engine.StepTimeoutError, TasksEngineError)
    assert "StepTimeoutError" in tasks_engine.__all__


def test_a_timed_out_step_fails_with_step_timeout_and_is_retried(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("timed_step", {"fire_in_process": True, "hangs": 1})
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output == {"slow": {"attempt": 2}, "after": {"aborted": False}}
    assert steps(res.run_id) == [
        ("slow", "failed", 1, TIMEOUT),
        ("slow", "completed", 2, None),
        ("after", "completed", 1, None),
    ]
    assert SideEffect.objects.filter(key="slow-returned").count() == 0


def test_a_step_that_returns_after_its_timeout_fired_still_fails(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue(
        "timed_step", {"fire_in_process": True, "hangs": 1, "watch": False, "hold": 0.05}
    )
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output["slow"] == {"attempt": 2}
    assert steps(res.run_id)[0] == ("slow", "failed", 1, TIMEOUT)
    assert SideEffect.objects.filter(key="slow-returned").count() == 1  # its result is dropped


def test_retries_spent_raise_step_timeout_in_the_workflow_and_the_next_step_is_not_aborted(
    fake_clock: FakeClock,
) -> None:
    res = tasks_engine.enqueue(
        "timed_step", {"fire_in_process": True, "hangs": 5, "max_attempts": 2}
    )
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output == {
        "slow": {"timed_out": "step 'slow' timed out after 0.5 seconds"},
        "after": {"aborted": False},
    }
    assert [s[:3] for s in steps(res.run_id)] == [
        ("slow", "failed", 1),
        ("slow", "failed", 2),
        ("after", "completed", 1),
    ]


def test_a_step_that_finishes_in_time_completes(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("timed_step", {"hangs": 0})
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output["slow"] == {"attempt": 1}


def test_an_atomic_step_that_outlives_its_timeout_unfired_fails_and_writes_nothing(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nobody fires the timer, as when a worker's heartbeat waits for SQLite's write lock, held
    # by this step's own transaction: the step itself finds it ran past its timeout.
    monkeypatch.setattr(tester, "_StepTimeouts", lambda prepared: contextlib.nullcontext())
    res = tasks_engine.enqueue("atomic_timed_step", {"timeout": 0.1, "hold": 0.3})
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output == (
        "timed out: step 'write' timed out after 0.1 seconds"
    )
    assert steps(res.run_id) == [("write", "failed", 1, TIMEOUT)]
    assert not Marker.objects.filter(key=f"atomic-timed:{res.run_id}").exists()


def test_a_timer_found_past_its_deadline_by_stop_counts_as_fired() -> None:
    timer = StepTimer("k", 0.01, WriteOff(1, {}, None))
    timer.deadline -= 1  # its time passed; nobody fired it
    fired = timer.stop()
    assert isinstance(fired, StepTimeoutError) and timer.fired is fired
    assert not timer.take_write_off()  # the step's thread records the attempt, not the heartbeat


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_invalid_timeouts_are_refused(bad: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        timeout_seconds(bad)  # type: ignore[arg-type]


def test_timeout_accepts_seconds_and_timedelta() -> None:
    assert timeout_seconds(2) == 2.0
    assert timeout_seconds(timedelta(minutes=1)) == 60.0
    assert timeout_seconds(None) is None


def test_timer_fires_once_and_only_when_due() -> None:
    fired: list[StepTimeoutError] = []
    t = StepTimer("s", 10.0, WriteOff(1, {}, None))
    assert not t.fire(t.deadline - 1, fired.append)
    assert t.fire(t.deadline, fired.append)
    assert not t.fire(t.deadline + 1, fired.append)
    assert len(fired) == 1 and t.stop() is fired[0]


def test_a_write_off_and_the_step_thread_never_both_record() -> None:
    t = StepTimer("s", 1.0, WriteOff(1, {}, None))
    assert not t.take_write_off()  # not fired: nothing to write off
    t.fire(t.deadline, lambda err: None)
    assert t.take_write_off()
    with pytest.raises(tasks_engine.LeaseLostError):
        t.stop()  # the stuck thread, when its body finally returns
    t2 = StepTimer("s", 1.0, WriteOff(1, {}, None))
    t2.fire(t2.deadline, lambda err: None)
    assert t2.stop() is not None
    assert not t2.take_write_off()  # the step recorded its own outcome first


def test_abort_signal_reset_clears_only_its_own_reason() -> None:
    sig = AbortSignal()
    timeout, cancel = StepTimeoutError("t"), tasks_engine.TaskCanceledError("c")
    assert sig.abort(timeout) and not sig.abort(cancel)
    sig.reset(cancel)
    assert sig.aborted and sig.reason is timeout
    sig.reset(timeout)
    assert not sig.aborted and sig.reason is None


def test_write_off_requeues_with_the_step_failed_and_fences_the_old_attempt(
    fake_clock: FakeClock,
) -> None:
    """What the heartbeat does for a step that ignores its timeout (run here by hand)."""
    res = tasks_engine.enqueue("noop", {"n": 1})
    claimed = transitions.claim_runs("w", [("noop", 1)], None, 1, 30.0)[0]
    step_id = transitions.start_step(claimed.lease, "only", "function", 1, 1)
    transitions.requeue_run(
        claimed.lease,
        fake_clock.now(),
        failed_step=(step_id, {"type": TIMEOUT, "message": "m", "terminal": True}),
    )
    with pytest.raises(tasks_engine.LeaseLostError):
        transitions.finish_step(claimed.lease, step_id, "completed", output=1)
    assert WorkflowRun.objects.get(pk=res.run_id).lease_token is None
    drain(fake_clock)
    run = WorkflowRun.objects.get(pk=res.run_id)
    # The next pass raises the recorded terminal StepTimeoutError in the workflow.
    assert (run.status, run.error["type"]) == ("failed", TIMEOUT)


# -- default deadlines --------------------------------------------------------------------------


def test_default_deadline_is_created_plus_deadline(
    fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ticking() -> datetime:  # every reading of the clock a moment later than the one before
        fake_clock.advance(0.001)
        return fake_clock.current

    monkeypatch.setattr(clock, "now", ticking)
    res = tasks_engine.enqueue("deadline_sleeper")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.deadline_at == run.created_at + timedelta(seconds=2)


def test_an_explicit_deadline_wins(fake_clock: FakeClock) -> None:
    at = fake_clock.now() + timedelta(days=3)
    res = tasks_engine.enqueue("deadline_sleeper", deadline_at=at)
    assert WorkflowRun.objects.get(pk=res.run_id).deadline_at == at


def test_a_workflow_without_deadline_has_none(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("noop")
    assert WorkflowRun.objects.get(pk=res.run_id).deadline_at is None


def test_default_deadline_fails_a_sleeping_run(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("deadline_sleeper")
    drain(fake_clock, horizon=0)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "waiting"
    assert run.available_at == run.deadline_at  # the hour-long nap is capped by the deadline
    drain(fake_clock, horizon=5)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.error["type"]) == (
        "failed",
        "tasks_engine.exceptions.DeadlineExceededError",
    )
    assert SideEffect.objects.filter(run_id=res.run_id, key="after").count() == 0


@pytest.mark.parametrize("has_parent", [False, True])
def test_a_completion_written_past_the_deadline_fails_the_run(
    fake_clock: FakeClock, has_parent: bool
) -> None:
    """The handler returns after the deadline, before any heartbeat aborted it (found by the
    simulation: the completion was written, and the run ended completed past its deadline)."""
    res = tasks_engine.enqueue(
        "noop", {"n": 1}, deadline_at=fake_clock.now() + timedelta(seconds=10)
    )
    claimed = transitions.claim_runs("w", [("noop", 1)], None, 1, 30.0)[0]
    step_id = transitions.start_step(claimed.lease, "only", "function", 1, 1)
    transitions.finish_step(claimed.lease, step_id, "completed", output=1)
    fake_clock.advance(11)
    written = transitions.complete_run(claimed.lease, "done", [], has_parent=has_parent)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, (run.error or {}).get("type"), run.output) == (
        "failed",
        "tasks_engine.exceptions.DeadlineExceededError",
        None,
    )
    assert written == "failed"
    assert run.finished_at >= run.deadline_at and run.lease_token is None
    assert steps(res.run_id) == [("only", "completed", 1, None)]  # its finished step is kept


def test_a_completion_before_the_deadline_completes(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue(
        "noop", {"n": 1}, deadline_at=fake_clock.now() + timedelta(seconds=10)
    )
    claimed = transitions.claim_runs("w", [("noop", 1)], None, 1, 30.0)[0]
    fake_clock.advance(9)
    assert transitions.complete_run(claimed.lease, "done", []) == "completed"
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.output) == ("completed", "done")


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1), 5])
def test_invalid_workflow_deadline_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        tasks_engine.workflow(name="bad_deadline", deadline=bad)(lambda ctx: None)  # type: ignore[arg-type]


# -- RetryPolicy and @workflow arguments: refused where the workflow is defined ---------------


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        # 1e300 was taken; the first transient failure then failed the run with OverflowError.
        ({"initial_interval": 1e300, "max_interval": 1e300}, ValueError, "initial_interval"),
        ({"max_interval": float("inf")}, ValueError, "max_interval"),
        ({"max_interval": MAX_DURATION + timedelta(seconds=1)}, ValueError, "max_interval"),
        ({"initial_interval": float("nan")}, ValueError, "initial_interval"),
        ({"initial_interval": -1}, ValueError, "initial_interval"),
        ({"initial_interval": "1"}, TypeError, "initial_interval"),
        ({"initial_interval": True}, TypeError, "initial_interval"),
        ({"backoff_coefficient": float("nan")}, ValueError, "backoff_coefficient"),
        ({"backoff_coefficient": float("inf")}, ValueError, "backoff_coefficient"),
        ({"backoff_coefficient": 0.5}, ValueError, "backoff_coefficient"),
        ({"backoff_coefficient": "2"}, TypeError, "backoff_coefficient"),
        ({"jitter": float("nan")}, ValueError, "jitter"),
        ({"jitter": -0.5}, ValueError, "jitter"),
        ({"jitter": 1.5}, ValueError, "jitter"),
        ({"jitter": True}, TypeError, "jitter"),
        ({"max_attempts": True}, TypeError, "max_attempts"),
        ({"max_attempts": 2.5}, TypeError, "max_attempts"),
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"non_retryable": ValueError}, TypeError, "non_retryable"),  # not a tuple of them
        ({"non_retryable": ("ValueError",)}, TypeError, "non_retryable"),
    ],
)
def test_a_bad_retry_policy_is_refused_where_it_is_made(
    args: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=f"^RetryPolicy.{names} ") as raised:
        tasks_engine.RetryPolicy(**args)
    assert repr(next(iter(args.values()))) in str(raised.value)


def test_a_retry_policy_takes_timedeltas_as_seconds() -> None:
    policy = tasks_engine.RetryPolicy(
        initial_interval=timedelta(seconds=2), max_interval=timedelta(minutes=1)
    )
    assert (policy.initial_interval, policy.max_interval) == (2.0, 60.0)
    assert policy == tasks_engine.RetryPolicy(initial_interval=2, max_interval=60)
    assert policy.delay(1) == 2.0
    assert tasks_engine.RetryPolicy(non_retryable=[KeyError]).non_retryable == (KeyError,)


def test_the_longest_retry_policy_retries_instead_of_failing_the_run(
    fake_clock: FakeClock,
) -> None:
    """The backoff is a wake time the run's row can hold, even with all the jitter."""
    policy = tasks_engine.RetryPolicy(
        initial_interval=MAX_DURATION, max_interval=MAX_DURATION, jitter=1.0
    )

    def flaky(ctx: tasks_engine.TaskContext) -> object:
        return ctx.step.run("flaky", lambda: 1 / 0)

    tasks_engine.workflow(flaky, name="longest_backoff", step_retry=policy)
    try:
        run_id = tasks_engine.enqueue("longest_backoff").run_id
        drain(fake_clock, horizon=0)
        row = WorkflowRun.objects.get(pk=run_id)
        assert row.status == "pending"
        assert row.available_at >= fake_clock.now() + MAX_DURATION
    finally:
        registry.unregister("longest_backoff", 1)


@pytest.mark.parametrize("retry", [3, {"max_attempts": 3}])
def test_a_step_retry_that_is_no_policy_fails_the_call_and_records_no_step(
    retry: object, fake_clock: FakeClock
) -> None:
    """It failed the run with AttributeError ('int' object has no attribute 'max_attempts')."""

    def bad_retry(ctx: tasks_engine.TaskContext) -> object:
        return ctx.step.run("s", lambda: 1, retry=retry)  # type: ignore[arg-type]

    tasks_engine.workflow(bad_retry, name="bad_step_retry")
    try:
        run_id = tasks_engine.enqueue("bad_step_retry").run_id
        drain(fake_clock)
        view = tasks_engine.get_run(run_id)
        assert view is not None and view.status == "failed"
        assert view.error["type"] == "builtins.TypeError"
        assert view.error["message"] == f"retry must be a RetryPolicy, not {retry!r}"
        assert not StepAttempt.objects.filter(run_id=run_id).exists()
    finally:
        registry.unregister("bad_step_retry", 1)


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        ({"retry": 3}, TypeError, "retry"),
        ({"step_retry": {"max_attempts": 3}}, TypeError, "step_retry"),
        ({"version": True}, TypeError, "version"),
        ({"version": "2"}, TypeError, "version"),
        ({"version": 0}, ValueError, "version"),
        ({"priority": 1.5}, TypeError, "priority"),
        ({"priority": 2**31}, ValueError, "priority"),
        ({"queue": ""}, ValueError, "queue"),
        ({"queue": "a\x00b"}, ValueError, "queue"),
        ({"queue": 5}, TypeError, "queue"),
        ({"deadline": timedelta(days=10**6)}, ValueError, "deadline"),  # OverflowError at enqueue
    ],
)
def test_bad_workflow_arguments_are_refused_where_it_is_defined(
    args: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        tasks_engine.workflow(name="bad_args", **args)(lambda ctx: None)
    assert registry.find("bad_args", args.get("version", 1)) is None


# -- run_child timeout ------------------------------------------------------------------------


def test_run_child_timeout_raises_step_timeout_cancels_the_child_and_replays(
    fake_clock: FakeClock,
) -> None:
    res = tasks_engine.enqueue("child_with_timeout", {"timeout": 60})
    drain(fake_clock, horizon=0)
    parent = WorkflowRun.objects.get(pk=res.run_id)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    assert (parent.status, child.status) == ("waiting", "waiting")
    assert parent.available_at == fake_clock.now() + timedelta(seconds=60)
    fake_clock.advance(61)
    drain(fake_clock, horizon=5)  # times out, then sleeps and replays the timeout
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output["got"].startswith("timeout: child run ")
    assert WorkflowRun.objects.get(pk=child.pk).status == "canceled"
    kid = [s for s in view.steps if s.name == "kid"]
    assert [(s.status, s.error["type"]) for s in kid] == [("failed", TIMEOUT)]


def test_run_child_finishing_in_time_is_not_timed_out(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("child_with_timeout", {"timeout": 60})
    drain(fake_clock, horizon=0)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    tasks_engine.signal(child.pk, "never", None)
    drain(fake_clock, horizon=5)
    assert tasks_engine.get_run(res.run_id).output == {"got": "finished"}


def test_a_child_that_finished_after_the_timeout_was_due_still_wins(
    fake_clock: FakeClock,
) -> None:
    """The child completes after the timeout is due, before the parent wakes: it wins."""
    res = tasks_engine.enqueue("child_with_timeout", {"timeout": 60})
    drain(fake_clock, horizon=0)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    fake_clock.advance(61)
    tasks_engine.signal(child.pk, "never", None)
    claimed = transitions.claim_runs("w", [("never_finishing_child", 1)], None, 1, 30.0)
    run, lease = claimed[0].run, claimed[0].lease
    wf, ctx = executor.build_context(run, lease, threading.Event(), claimed[0].prestarted)
    assert executor.execute(run, wf, ctx) == "completed"
    drain(fake_clock, horizon=5)
    assert tasks_engine.get_run(res.run_id).output == {"got": "finished"}


def test_time_out_child_writes_nothing_when_the_child_has_finished(
    fake_clock: FakeClock,
) -> None:
    res = tasks_engine.enqueue("child_with_timeout", {"timeout": 60})
    drain(fake_clock, horizon=0)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    tasks_engine.cancel(child.pk)
    claimed = transitions.claim_runs("w", [("child_with_timeout", 1)], None, 1, 30.0)[0]
    kid = StepAttempt.objects.get(run_id=res.run_id, name="kid")
    assert not transitions.time_out_child(claimed.lease, kid.pk, child.pk, {"type": "x"})
    assert StepAttempt.objects.get(pk=kid.pk).status == "running"
