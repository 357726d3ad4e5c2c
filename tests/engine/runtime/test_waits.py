"""Facts, timeouts, checks and child runs, executed in-process with a fake clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

import tasks_engine
from tasks_engine import testing
from tasks_engine.models import Fact, StepAttempt, WorkflowRun
from tests.helpers import FakeClock, drain
from tests.testapp.models import Marker
from tests.testapp.wait_workflows import DURATIONS

pytestmark = pytest.mark.django_db


def status(run_id) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def test_fact_signalled_before_the_run_starts_is_seen() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("fact_waiter", {"count": 1})
        assert t.signal(run, "item", {"n": 1}) == tasks_engine.Signaled(True, "pending")
        assert t.run_to_completion(run).output == [{"n": 1}]


def test_fact_while_waiting_wakes_the_run() -> None:
    with testing.WorkflowTester() as t:
        run_id = t.start("fact_waiter", {"count": 1})
        t.run_until_idle()
        run = WorkflowRun.objects.get(pk=run_id)
        assert (run.status, run.waiting_on, run.available_at) == ("waiting", "fact:item", None)
        assert t.signal(run_id, "item", "payload").delivered is True
        assert t.get_run(run_id).status == "pending"
        assert t.run_to_completion(run_id).output == ["payload"]


def test_a_loop_of_waits_sees_each_fact_once_in_order() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("fact_waiter", {"count": 3})
        t.signal(run, "item", 1)
        t.signal(run, "item", 2)
        t.run_until_idle()
        assert t.get_run(run).status == "waiting"
        t.signal(run, "item", 3)
        t.signal(run, "other", "ignored")
        view = t.run_to_completion(run)
        assert view.output == [1, 2, 3]
        assert [s.name for s in t.steps(run)] == ["item", "item#2", "item#3"]
    assert list(Fact.objects.filter(name="item").values_list("consumed_by", flat=True)) == [
        "item",
        "item#2",
        "item#3",
    ]


def test_fact_timeout_raises_and_replays_as_timeout() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("fact_timeout")
        t.run_until_idle()  # a fact's timeout is not jumped: the test could still signal
        assert t.get_run(run).status == "waiting"
        # times out, sleeps, replays (raising the timeout again), completes
        view = t.run_to_completion(run)
        assert view.status == "completed"
        assert view.output["got"].startswith("timeout: no fact 'never'")
        steps = [(s.name, s.status) for s in t.steps(run)]
        assert steps == [("never", "failed"), ("after", "completed")]
    assert WorkflowRun.objects.get(pk=run).attempts == 3


def test_a_fact_timeout_reports_the_waits_full_length_not_the_time_left_on_replay(
    fake_clock: FakeClock,
) -> None:
    """The pass that wakes at the timeout recomputes the time left (0 by then): the error
    still names the length the wait was armed with."""
    res = tasks_engine.enqueue("fact_until_deadline")
    drain(fake_clock, horizon=0)
    assert status(res.run_id) == "waiting"
    fake_clock.advance(21)
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(res.run_id)
    assert view.output == {"got": "no fact 'never' arrived within 20 seconds"}
    [wait] = [s for s in view.steps if s.name == "never"]
    assert wait.error["message"] == "no fact 'never' arrived within 20 seconds"


def test_fact_after_timeout_is_not_taken(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("fact_waiter", {"count": 1, "timeout": 5})
    drain(fake_clock, horizon=0)
    fake_clock.advance(6)
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.FactTimeoutError"
    assert tasks_engine.signal(res.run_id, "item", 1) == tasks_engine.Signaled(False, "failed")
    assert not Fact.objects.exists()


def test_check_callable_is_consulted_on_each_interval(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("fact_check")
    drain(fake_clock, horizon=0)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "waiting" and run.available_at is not None  # wakes to re-check
    fake_clock.advance(11)
    drain(fake_clock, horizon=0)
    assert status(res.run_id) == "waiting"
    Marker.objects.create(key=f"ready:{res.run_id}", value="from-db")
    fake_clock.advance(11)
    drain(fake_clock, horizon=0)
    assert tasks_engine.get_run(res.run_id).output == {"value": "from-db"}


def test_signal_once_cancel_is_requested_is_refused(fake_clock: FakeClock) -> None:
    from tasks_engine import transitions

    res = tasks_engine.enqueue("fact_waiter")
    transitions.claim_runs("w", [("fact_waiter", 1)], None, 1, 30)
    assert tasks_engine.cancel(res.run_id, "stop") is True  # running: request recorded
    assert tasks_engine.signal(res.run_id, "item", 1) == tasks_engine.Signaled(False, "running")
    assert not Fact.objects.exists()


def test_child_output_flows_back(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("parent", {"value": 21})
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output == {"child": {"double": 42}}
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    assert (child.status, child.parent_step, child.trace_id) == ("completed", "kid", view.trace_id)
    assert child.idempotency_key == f"child:{res.run_id}:kid"


def test_child_failure_is_raised_in_the_parent(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("parent_catches", {"value": 3, "fail": True})
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output == "caught: child refused 3"


def test_parent_waits_for_a_sleeping_child_and_wakes_when_it_ends(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("parent", {"value": 1, "sleep": 30})
    drain(fake_clock, horizon=0)
    parent = WorkflowRun.objects.get(pk=res.run_id)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    assert (parent.status, parent.waiting_on) == ("waiting", f"child:{child.pk}")
    assert parent.available_at is None
    fake_clock.advance(31)
    drain(fake_clock, horizon=0)
    assert tasks_engine.get_run(res.run_id).output == {"child": {"double": 2}}


def test_canceling_the_parent_cancels_the_child(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("parent", {"value": 1, "sleep": 30})
    drain(fake_clock, horizon=0)
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    assert tasks_engine.cancel(res.run_id, "user said stop") is True
    assert status(res.run_id) == "canceled"
    child.refresh_from_db()
    assert child.status == "canceled"
    assert not StepAttempt.objects.filter(status="running").exists()
    assert tasks_engine.signal(res.run_id, "x") == tasks_engine.Signaled(False, "canceled")


def test_a_fact_for_a_run_waiting_on_something_else_is_stored_but_does_not_wake_it(
    fake_clock: FakeClock,
) -> None:
    res = tasks_engine.enqueue("sleeper", {"seconds": 60})
    drain(fake_clock, horizon=0)
    assert status(res.run_id) == "waiting"
    out = tasks_engine.signal(res.run_id, "unrelated", 1)
    assert out == tasks_engine.Signaled(True, "waiting")
    assert status(res.run_id) == "waiting"
    assert Fact.objects.filter(run_id=res.run_id, name="unrelated").count() == 1


# -- durations given to waits: checked where they are given -----------------------------------


@pytest.mark.parametrize(
    ("call", "value", "error", "names"),
    [
        # NaN failed the run with "cannot convert float NaN to integer" from deep inside.
        ("sleep", "nan", ValueError, "sleep duration"),
        ("sleep", "inf", ValueError, "sleep duration"),
        ("sleep", "negative", ValueError, "sleep duration"),  # was taken as 0
        ("sleep", "huge", ValueError, "sleep duration"),  # OverflowError
        ("sleep", "true", TypeError, "sleep duration"),  # was a 1-second sleep
        ("sleep", "text", TypeError, "sleep duration"),
        ("fact_timeout", "nan", ValueError, "timeout"),
        ("fact_timeout", "inf", ValueError, "timeout"),
        ("fact_timeout", "negative", ValueError, "timeout"),
        ("fact_timeout", "huge", ValueError, "timeout"),
        ("fact_timeout", "true", TypeError, "timeout"),
        # 0 re-claimed the run in a tight loop, hundreds of claims a second.
        ("check_interval", "zero", ValueError, "check_interval"),
        ("check_interval", "negative", ValueError, "check_interval"),
        ("check_interval", "nan", ValueError, "check_interval"),
        ("check_interval", "inf", ValueError, "check_interval"),
        ("check_interval", "huge", ValueError, "check_interval"),
        ("check_interval", "text", TypeError, "check_interval"),
        ("child_timeout", "huge", ValueError, "timeout"),  # OverflowError
    ],
)
def test_a_bad_wait_duration_fails_the_run_at_the_call_and_records_no_step(
    call: str, value: str, error: type[Exception], names: str
) -> None:
    with testing.WorkflowTester(limit=20) as t:
        run = t.start("wait_with_duration", {"call": call, "value": value})
        view = t.run_to_completion(run)
    assert view.status == "failed"
    assert view.attempts == 1
    assert view.error["type"] == f"builtins.{error.__name__}"
    assert view.error["message"].startswith(names)
    assert repr(DURATIONS[value]) in view.error["message"]
    assert not StepAttempt.objects.filter(run_id=run).exists()
    assert WorkflowRun.objects.count() == 1  # no child either


@pytest.mark.parametrize(
    ("call", "value", "output"),
    [
        ("sleep", "zero", "slept"),
        ("sleep", "a_minute", "slept"),
        ("fact_timeout", "zero", "timed out"),  # takes a fact already there, else times out
        ("fact_timeout", "a_minute", "timed out"),
    ],
)
def test_valid_wait_durations_still_work(call: str, value: str, output: str) -> None:
    with testing.WorkflowTester() as t:
        run = t.start("wait_with_duration", {"call": call, "value": value})
        assert t.run_to_completion(run).output == output


def test_a_check_interval_as_a_timedelta_wakes_the_run_at_it() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("wait_with_duration", {"call": "check_interval", "value": "a_minute"})
        t.run_until_idle()
        row = WorkflowRun.objects.get(pk=run)
        assert (row.status, row.available_at) == ("waiting", t.now + timedelta(minutes=1))
