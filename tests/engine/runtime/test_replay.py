"""Replay semantics: stored results, numbering, retries, memoized failures, workflow retries."""

from __future__ import annotations

import pytest

import tasks_engine
from tasks_engine import clock, testing, transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import FakeClock, drain
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def effects(key: str | None = None) -> int:
    qs = SideEffect.objects.all()
    return qs.filter(key=key).count() if key else qs.count()


def test_steps_run_once_and_results_are_returned(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("three_steps", {"n": 1})
    assert drain(fake_clock) == ["completed"]
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output == ["a", "b", "c"]
    assert [(s.name, s.kind, s.status, s.attempt) for s in view.steps] == [
        ("a", "function", "completed", 1),
        ("b", "function", "completed", 1),
        ("c", "function", "completed", 1),
    ]
    assert effects() == 3
    assert view.started_at is not None and view.finished_at is not None


def test_repeated_step_names_are_numbered(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("repeat_names")
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert [s.name for s in view.steps] == ["fetch", "fetch#2", "fetch#3"]
    assert view.output == [0, 1, 2]


def test_replay_after_sleep_does_not_rerun_finished_steps() -> None:
    with testing.WorkflowTester() as t:
        run_id = t.start("sleeper", {"seconds": 30})
        assert t.run_until_idle(jump=False) == ["suspended"]
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == "waiting" and run.waiting_on == "sleep:nap"
        t.advance(31)
        assert t.run_until_idle(jump=False) == ["completed"]
    assert (effects("before"), effects("after")) == (1, 1)
    assert WorkflowRun.objects.get(pk=run_id).attempts == 2


def test_step_failing_twice_under_three_attempts_completes() -> None:
    with testing.WorkflowTester() as t:
        run = t.start("flaky", {"fail_times": 2})
        view = t.run_to_completion(run)  # over both retry backoffs
        assert view.status == "completed", view.error
        assert view.output == "ok"
        steps = t.steps(run)
    assert [(s.attempt, s.status) for s in steps] == [
        (1, "failed"),
        (2, "failed"),
        (3, "completed"),
    ]
    assert steps[0].error["message"] == "failure 1"
    assert effects("flaky") == 3


def test_step_failing_always_fails_the_run_with_last_error() -> None:
    with testing.WorkflowTester() as t:
        view = t.run_to_completion(t.start("flaky", {"fail_times": 99}))
    assert view.status == "failed"
    assert view.error["type"] == "tests.testapp.workflows.AppError"
    assert view.error["message"] == "failure 3"
    assert "Traceback" in view.error["traceback"]
    assert effects("flaky") == 3


def test_caught_step_failure_replays_as_the_same_error(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("catcher")
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.output == {"caught": "AppError: always broken"}
    # The workflow was replayed after its sleep; the failed step did not run again.
    assert WorkflowRun.objects.get(pk=res.run_id).attempts >= 2
    assert effects("boom") == 2


def test_non_retryable_error_fails_at_once(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("fatal")
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.NonRetryableError"
    assert effects("fatal") == 1


def test_suspension_is_not_swallowed_by_except_exception(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("swallow")
    drain(fake_clock, horizon=0)
    assert WorkflowRun.objects.get(pk=res.run_id).status == "waiting"
    fake_clock.advance(3601)
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output == "woke"


def test_workflow_retry_reruns_failed_steps_but_not_completed_ones(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("run_retry")
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed", view.error
    assert (effects("stable"), effects("shaky")) == (1, 2)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.failures == 1


def test_workflow_retry_budget_counts_failures_not_claims(fake_clock: FakeClock) -> None:
    # The sleeper is claimed twice (sleep + wake) but never fails: failures stay 0.
    res = tasks_engine.enqueue("sleeper", {"seconds": 1})
    drain(fake_clock)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.attempts, run.failures) == ("completed", 2, 0)


def test_max_step_attempts_per_run(fake_clock: FakeClock, settings) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "MAX_STEP_ATTEMPTS_PER_RUN": 5}
    res = tasks_engine.enqueue("many_steps", {"n": 10})
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"].endswith("MaxStepAttemptsExceeded")
    assert len(view.steps) == 5


def test_deadline_passed_fails_the_run(fake_clock: FakeClock) -> None:
    from datetime import timedelta

    res = tasks_engine.enqueue(
        "sleeper", {"seconds": 100}, deadline_at=clock.now() + timedelta(seconds=10)
    )
    drain(fake_clock, horizon=0)
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "waiting"
    assert run.available_at == run.deadline_at  # the wake time is capped by the deadline
    fake_clock.advance(11)
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.DeadlineExceededError"
    assert not StepAttempt.objects.filter(run_id=res.run_id, status="running").exists()


def test_renamed_step_is_reported_as_unreached(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("sleeper", {"seconds": 5})
    drain(fake_clock, horizon=0)
    # Pretend an older code version recorded a step that the current code never calls.
    lease = transitions.claim_runs("w", [("sleeper", 1)], None, 1, 30)
    assert lease == []  # still waiting
    StepAttempt.objects.create(
        run_id=res.run_id,
        name="old-step",
        kind="function",
        status="completed",
        attempt=1,
        started_at=clock.now(),
    )
    fake_clock.advance(6)
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.unreached_steps == ["old-step"]


def test_nondeterminism_when_a_step_changes_kind(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("sleeper", {"seconds": 5})
    drain(fake_clock, horizon=0)
    StepAttempt.objects.filter(run_id=res.run_id, name="before").update(kind="sleep")
    fake_clock.advance(6)
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.NonDeterminismError"


def test_atomic_step_commits_business_row_with_checkpoint(fake_clock: FakeClock) -> None:
    from tests.testapp.models import Marker

    res = tasks_engine.enqueue("atomic_marker", {"n": 3})
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output == "written"
    assert Marker.objects.get(key=f"atomic:{res.run_id}").value == "3"


def test_input_validation_failure_at_replay_is_recorded(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("noop", {"n": 1})
    WorkflowRun.objects.filter(pk=res.run_id).update(input={"n": "garbage"})
    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).status == "failed"


def test_the_last_progress_of_a_quick_run_is_kept(fake_clock: FakeClock) -> None:
    res = tasks_engine.enqueue("quick_progress")
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed"
    assert view.progress == {"done": 5, "total": 5, "message": "chunk 5/5"}


@pytest.mark.parametrize("how", ["sleep", "fact", "child", "retry", "fail"])
def test_progress_reported_just_before_the_run_lets_go_is_kept(
    fake_clock: FakeClock, how: str
) -> None:
    """The heartbeat's flush writes progress at most once a second, under the lease: the
    park or the step's backoff that gives the lease up carries what it has not written."""
    res = tasks_engine.enqueue("progress_then_park", {"how": how})
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == {"retry": "pending", "fail": "failed"}.get(how, "waiting")
    assert view.progress == {"done": 3, "total": 10, "message": "three"}
