"""tasks_engine.testing: runs driven in-process, on the real engine, with a fake clock."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import pytest

from tasks_engine import clock, testing
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock
from tests.testapp import observe_workflows
from tests.testapp.observe_workflows import observe_acquire

pytestmark = pytest.mark.django_db


def test_acquire_jumps_the_week_long_sleep_and_takes_the_fact() -> None:
    with testing.WorkflowTester() as t:
        started = t.now
        run = t.start(observe_acquire, {"plan_id": 7})
        t.run_until_idle()
        assert t.get_run(run).status == "waiting"  # on the fact: nothing to jump to but 7 days
        assert t.now == started  # idle does not jump over the fact's timeout
        assert t.signal(run, "download-done", {"size": 42}).delivered
        view = t.run_to_completion(run)
        assert view.status == "completed"
        assert view.output == {"ok": True, "size": 42}
        assert t.now - started >= timedelta(days=7)
        steps = [(s.name, s.kind, s.status) for s in t.steps(run)]
        assert steps == [
            ("submit", "function", "completed"),
            ("download-done", "fact_wait", "completed"),
            ("copy", "function", "completed"),
            ("retention", "sleep", "completed"),
            ("cleanup", "function", "completed"),
        ]


def test_run_until_idle_without_jump_leaves_timers_alone() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("observe_nap")
        assert t.run_until_idle(jump=False) == ["suspended"]
        assert t.get_run(run).status == "waiting"
        t.advance(29)
        assert t.run_until_idle(jump=False) == []
        t.advance(1)
        assert t.run_until_idle(jump=False) == ["completed"]
        assert t.get_run(run).output == "rested"


def test_fact_timeout_is_jumped_by_run_to_completion() -> None:
    with testing.WorkflowTester() as t:
        started = t.now
        run = t.start("observe_fact_timeout")
        assert t.run_to_completion(run).output == "timed out"
        assert timedelta(hours=12) <= t.now - started < timedelta(hours=13)


def test_fact_before_the_timeout_wins() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("observe_fact_timeout")
        t.run_until_idle(jump=False)
        t.signal(run, "approval", {"by": "ops"})
        assert t.run_to_completion(run).output == "approved"


def test_retry_backoffs_are_jumped() -> None:
    observe_workflows.ATTEMPTS.pop("jumped", None)
    with testing.WorkflowTester() as t:
        started = t.now
        run = t.start("observe_backoff", {"key": "jumped", "failures": 3})
        view = t.run_to_completion(run)
        assert view.status == "completed"
        assert view.output == 4
        assert [s.status for s in t.steps(run)] == ["failed", "failed", "failed", "completed"]
        assert t.now - started >= timedelta(minutes=30)  # three backoffs of 10 min or more


def test_run_to_completion_refuses_a_run_waiting_for_a_fact() -> None:
    with testing.WorkflowTester() as t:
        run = t.start(observe_acquire, {"plan_id": 1})
        t.run_until_idle(jump=False)
        with pytest.raises(AssertionError, match="waiting on 'fact:download-done'"):
            t.run_to_completion(run, jump=False)


def test_the_clock_is_restored_and_never_goes_back() -> None:
    real = clock.now
    with testing.WorkflowTester() as t:
        assert clock.now is not real
        with pytest.raises(ValueError, match="does not go back"):
            t.advance(-1)
    assert clock.now is real


def test_unknown_run_and_cancel() -> None:
    with testing.WorkflowTester() as t:
        with pytest.raises(AssertionError, match="no run"):
            t.get_run("00000000-0000-0000-0000-000000000000")
        run = t.start(observe_acquire, {"plan_id": 2})
        t.run_until_idle(jump=False)
        assert t.cancel(run, "test")
        assert t.run_to_completion(run).status == "canceled"
        assert WorkflowRun.objects.filter(pk=run, status="canceled").exists()


def test_a_step_timeout_aborts_the_step_in_the_tester_as_in_a_worker() -> None:
    """The tester had no heartbeat: a step with timeout=0.3 that watched its abort signal ran
    its whole body (3 s here) and completed late, where a worker aborts it at 0.3 s."""
    with testing.WorkflowTester() as t:
        run = t.start("timed_step", {"timeout": 0.3, "hangs": 1, "hold": 3.0})
        view = t.run_to_completion(run)
    assert view.status == "completed"
    assert view.output["slow"] == {"attempt": 2}  # the first attempt timed out, the retry ran
    failed = [s for s in t.steps(run) if s.name == "slow" and s.status == "failed"]
    assert len(failed) == 1 and "timed out after 0.3 seconds" in failed[0].error["message"]


def test_a_fact_wait_s_checks_are_jumped_by_run_to_completion_not_run_until_idle() -> None:
    """A check= wait is due again at every interval: idle never comes by jumping to it (the
    test says when, with advance() or run_to_completion())."""
    from tests.testapp.models import Marker

    with testing.WorkflowTester() as t:
        started = t.now
        run = t.start("fact_check")  # checks every 10 s, no timeout
        assert t.run_until_idle() == ["suspended"]
        assert t.now == started and t.get_run(run).status == "waiting"
        Marker.objects.create(key=f"ready:{run}", value="7")
        assert t.run_to_completion(run).output == {"value": "7"}  # the next check found it
        assert timedelta(seconds=10) <= t.now - started < timedelta(seconds=11)


def _limit_default_queue(settings: Any, **limits: Any) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"default": limits}}


def test_the_clock_jumps_over_a_queue_s_rate_limit_window(settings: Any) -> None:
    """Runs due but held back by the queue's rate limit are not "nothing more is due": the
    clock jumps to when the sliding window frees a place (the oldest claim in it leaves)."""
    _limit_default_queue(settings, rate_limit="1/m")
    with testing.WorkflowTester() as t:
        started = t.now
        runs = [t.start("noop", {"n": n}) for n in range(3)]
        assert t.run_until_idle() == ["completed"] * 3
        assert t.now - started == timedelta(minutes=2)  # one claim a minute
        assert [t.get_run(r).status for r in runs] == ["completed"] * 3
        more = [t.start("noop", {"n": n}) for n in range(3, 5)]
        assert t.run_to_completion(more[-1]).status == "completed"
        assert t.get_run(more[0]).status == "completed"
        assert t.now - started == timedelta(minutes=4)


def test_without_jump_a_rate_limited_run_stays_pending(settings: Any) -> None:
    _limit_default_queue(settings, rate_limit="1/m")
    with testing.WorkflowTester() as t:
        started = t.now
        runs = [t.start("noop", {"n": n}) for n in range(2)]
        assert t.run_until_idle(jump=False) == ["completed"]
        assert t.now == started and t.get_run(runs[1]).status == "pending"
        with pytest.raises(AssertionError, match="is pending"):
            t.run_to_completion(runs[1], jump=False)
        t.advance(60)
        assert t.run_until_idle(jump=False) == ["completed"]


@pytest.mark.parametrize(
    "limits", [{"rate_limit": "1/m"}, {"concurrency": 1}, {"concurrency": 1, "rate_limit": "2/h"}]
)
def test_a_parent_and_its_child_in_one_limited_queue_finish(
    settings: Any, limits: dict[str, Any]
) -> None:
    """The parent waits for its child (a waiting run holds no place): the child is claimed
    once the queue's window has room, then the parent once more."""
    _limit_default_queue(settings, **limits)
    with testing.WorkflowTester() as t:
        run = t.start("parent", {"value": 2})
        view = t.run_to_completion(run)
        assert (view.status, view.output) == ("completed", {"child": {"double": 4}})
        [child] = WorkflowRun.objects.filter(parent_run_id=run)
        assert child.status == "completed"


def test_a_timer_due_before_the_rate_window_frees_comes_first(settings: Any) -> None:
    """A run held back by queue default's rate limit until minute 1 does not make a sleep in
    another queue that ends at 10 s wake late."""
    _limit_default_queue(settings, rate_limit="1/m")
    with testing.WorkflowTester() as t:
        started = t.now
        held = [t.start("noop", {"n": n}) for n in range(2)]
        napper = t.start("sleeper", {"seconds": 10}, queue="naps")
        t.run_until_idle()
        woke = next(s.started_at for s in t.steps(napper) if s.name == "after")
        assert woke - started == timedelta(seconds=10)
        ends = [t.get_run(r).finished_at for r in held]
        assert [end - started for end in ends if end] == [timedelta(0), timedelta(minutes=1)]


def test_a_step_timeout_past_what_a_thread_can_wait_leaves_later_timeouts_working() -> None:
    """timeout=1e10 crashed the tester's timeout thread (OverflowError from Event.wait: past
    threading.TIMEOUT_MAX); the next step's 0.3 s timeout then never fired."""
    with testing.WorkflowTester() as t:
        run = t.start("long_then_short_timeout")
        view = t.run_to_completion(run)
    assert view.output == {"long": "done", "short": "step 'short' timed out after 0.3 seconds"}


@pytest.mark.parametrize(
    ("start", "error"),
    [
        (datetime(2030, 1, 1), ValueError),  # naive: failed later, comparing with aware times
        ("2030-01-01T00:00:00Z", TypeError),
        (date(2030, 1, 1), TypeError),
        (datetime.max.replace(tzinfo=timezone(timedelta(hours=-5))), ValueError),  # year 10000
    ],
)
def test_the_tester_refuses_a_start_that_is_no_aware_datetime(start: object, error: type) -> None:
    with pytest.raises(error, match="start"):
        testing.WorkflowTester(start=start)  # type: ignore[arg-type]
    aware = datetime(2030, 1, 1, tzinfo=UTC)
    assert testing.WorkflowTester(start=aware).now == aware


@pytest.mark.parametrize(
    ("seconds", "error"), [(float("nan"), ValueError), (-1, ValueError), ("5", TypeError)]
)
def test_advance_refuses_a_bad_duration(seconds: object, error: type) -> None:
    with testing.WorkflowTester() as t, pytest.raises(error, match="advance"):
        t.advance(seconds)  # type: ignore[arg-type]


def test_run_to_completion_of_an_unknown_run_runs_nothing() -> None:
    """A run id from another test (or a typo) was found unknown only after the drive: every
    other due run had been executed by then (steps written) before the AssertionError."""
    with testing.WorkflowTester() as t:
        other = t.start("three_steps", {"n": 1})
        with pytest.raises(AssertionError, match="no run 00000000-0000-0000-0000-000000000000"):
            t.run_to_completion("00000000-0000-0000-0000-000000000000")
        assert t.get_run(other).status == "pending"
        assert t.steps(other) == []


def test_run_to_completion_says_when_the_execution_limit_stopped_it() -> None:
    """`limit` counted clock jumps as executions (limit=2: one execution, one jump over the
    backoff), and the error then said "nothing more is due: signal it, or advance the clock",
    though a retry was due and the limit had stopped the drive."""
    observe_workflows.ATTEMPTS.pop("limited", None)
    with testing.WorkflowTester(limit=2) as t:
        run = t.start("observe_backoff", {"key": "limited", "failures": 3})
        with pytest.raises(AssertionError, match=r"stopped after 2 executions \(limit=2\)"):
            t.run_to_completion(run)


def test_driving_a_tester_that_was_not_entered_is_an_error() -> None:
    """Without `with`, the engine kept the real clock: a 10 s sleep was never jumped and
    run_to_completion said the run waits with "nothing more is due"."""
    t = testing.WorkflowTester()
    run = t.start("sleeper", {"seconds": 10})
    for drive in (t.run_until_idle, lambda: t.run_to_completion(run), lambda: t.advance(10)):
        with pytest.raises(RuntimeError, match=r"with testing\.WorkflowTester"):
            drive()
    assert t.get_run(run).status == "pending"


def test_a_step_s_floats_replay_as_they_first_came_back_on_both_databases() -> None:
    """PostgreSQL's jsonb keeps a number, not its notation: a step that returned 1e20 (Python
    writes 1e+20) gave the float on its first pass and the int 100000000000000000000 on
    replay, -0.0 came back as 0.0, and SQLite kept the floats: the workflow saw other values
    after a sleep, and on the other database."""
    with testing.WorkflowTester() as t:
        view = t.run_to_completion(t.start("float_results"))
    assert view.output["first"] == view.output["replayed"]
    assert view.output["replayed"] == [
        repr([10**20, -(15 * 10**16), 0.0, 1e-07, 2.5]),
        repr(10**20),
    ]


def test_a_step_that_uses_the_run_s_whole_attempt_budget_fails_the_run_as_in_a_worker(
    settings: Any,
) -> None:
    """The default limit (1000 executions) equalled the default MAX_STEP_ATTEMPTS_PER_RUN: a
    step retried without end stopped the tester one execution before the engine failed the
    run, so run_to_completion raised where a worker ends the run `failed`. The default limit
    now leaves room past the cap, whatever the cap."""
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "MAX_STEP_ATTEMPTS_PER_RUN": 40}
    with testing.WorkflowTester() as t:
        view = t.run_to_completion(t.start("always_fails_step"))
    assert view.status == "failed"
    assert view.error["message"] == "run made 40 step attempts (limit 40)"
    for cap in (1000, 5000):
        settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "MAX_STEP_ATTEMPTS_PER_RUN": cap}
        assert testing.WorkflowTester().limit > cap


@pytest.mark.parametrize(
    ("worker_id", "error"),
    [(None, TypeError), ("", ValueError), ("w" * 201, ValueError), ("a\x00b", ValueError)],
)
def test_the_tester_refuses_a_worker_id_no_row_can_hold(worker_id: object, error: type) -> None:
    """A worker id too long or holding a NUL failed the first claim's statement (PostgreSQL:
    the test's transaction aborted; SQLite stored the NUL), None did too: now the tester and
    drain refuse it up front, before any claim."""
    with pytest.raises(error, match="worker_id"):
        testing.WorkflowTester(worker_id=worker_id)  # type: ignore[arg-type]
    with pytest.raises(error, match="worker_id"):
        testing.drain(worker_id=worker_id)  # type: ignore[arg-type]


def test_drain_jumps_only_to_timers_of_the_runs_it_claims(fake_clock: FakeClock) -> None:
    """drain(pairs=[noop]) jumped the clock a day, to the wake-up of a sleeper it could not
    claim, then stopped: the next steps of the test ran a day late."""
    from tasks_engine import enqueue

    started = fake_clock.now()
    enqueue("sleeper", {"seconds": 86400})
    assert testing.drain(fake_clock, pairs=[("sleeper", 1)], horizon=10) == ["suspended"]
    enqueue("noop", {"n": 1})
    assert testing.drain(fake_clock, pairs=[("noop", 1)]) == ["completed"]
    assert fake_clock.now() == started


def test_what_a_workflow_reads_of_its_run_is_read_only() -> None:
    """Assigning to `ctx.input` (or any field of the run) fails at once: the engine reads them
    back (the input for logs and replay, the token for fencing), so none may change under it."""
    from tasks_engine import TaskContext, workflow
    from tasks_engine.definitions import registry

    @workflow(name="assigns-its-context")
    def assigns(ctx: TaskContext) -> dict:
        refused = []
        for field in ("input", "run_id", "task_name", "version", "queue", "trace_id",
                      "priority", "attempt", "attempt_token", "abort_signal", "step"):  # fmt: skip
            try:
                setattr(ctx, field, None)
            except AttributeError:
                refused.append(field)
        return {"refused": refused, "input": ctx.input}

    try:
        with testing.WorkflowTester() as t:
            view = t.run_to_completion(t.start(assigns, {"n": 1}))
    finally:
        registry.unregister("assigns-its-context", 1)
    assert view.status == "completed", view.error
    assert view.output == {
        "refused": ["input", "run_id", "task_name", "version", "queue", "trace_id",
                    "priority", "attempt", "attempt_token", "abort_signal", "step"],
        "input": {"n": 1},
    }  # fmt: skip
