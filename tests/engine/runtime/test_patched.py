"""`ctx.patched` and `manage.py tasks replay-check`, in-process ("a deploy" flips the code that
tests/testapp/timeout_workflows.py runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tasks_engine
from tasks_engine.definitions import registry
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.runtime import replay_check
from tests.helpers import FakeClock, drain
from tests.testapp import timeout_workflows

pytestmark = pytest.mark.django_db


@pytest.fixture
def code() -> Iterator[dict[str, str]]:
    saved = dict(timeout_workflows.PATCH_CODE)
    timeout_workflows.PATCH_CODE["code"] = "old"
    yield timeout_workflows.PATCH_CODE
    timeout_workflows.PATCH_CODE.update(saved)


def names(run_id) -> list[tuple[str, str]]:
    return list(
        StepAttempt.objects.filter(run_id=run_id).order_by("id").values_list("name", "kind")
    )


def test_a_run_mid_way_on_old_code_keeps_the_old_path_new_runs_take_the_new(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    old = tasks_engine.enqueue("patched_flow").run_id
    drain(fake_clock, horizon=0)  # a, b, parked on "go"
    code["code"] = "new"  # the deploy
    new = tasks_engine.enqueue("patched_flow").run_id
    drain(fake_clock, horizon=0)
    for run_id in (old, new):
        tasks_engine.signal(run_id, "go")
    drain(fake_clock, horizon=0)  # both replay from the top
    assert tasks_engine.get_run(old).output == {"path": "old"}
    assert tasks_engine.get_run(new).output == {"path": "new"}
    assert names(old) == [("a", "function"), ("b", "function"), ("go", "fact_wait")]
    assert names(new) == [
        ("a", "function"),
        ("patch:use-c", "patch"),
        ("c", "function"),
        ("go", "fact_wait"),
    ]
    assert tasks_engine.get_run(new).unreached_steps == []


def test_a_run_parked_before_the_patch_point_takes_the_new_path(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    """The old code had not passed the patch point yet: nothing recorded after it."""
    run_id = tasks_engine.enqueue("patched_flow").run_id
    claimed = tasks_engine.transitions.claim_runs("w", [("patched_flow", 1)], None, 1, 30.0)[0]
    tasks_engine.transitions.start_step(claimed.lease, "a", "function", 1, 1)
    tasks_engine.transitions.requeue_run(claimed.lease, fake_clock.now())  # "a" interrupted
    code["code"] = "new"
    drain(fake_clock, horizon=0)
    tasks_engine.signal(run_id, "go")
    drain(fake_clock, horizon=0)
    assert tasks_engine.get_run(run_id).output == {"path": "new"}


def test_patched_validates_its_change_id(code: dict[str, str]) -> None:
    from tasks_engine.runtime.patches import PatchSteps

    probe = PatchSteps.__new__(PatchSteps)  # no run: the id is refused before any is read
    with pytest.raises(ValueError):
        probe.patched("")
    with pytest.raises(ValueError):
        probe.patched("a#b")


def test_a_removed_patch_marker_does_not_flip_another_patch(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    """Markers are not "steps the old code ran": retiring one `patched` call (its marker no
    longer reached) leaves every other answer as it was, and is not an unreached step."""
    code["code"] = "new"
    run_id = tasks_engine.enqueue("patched_flow").run_id
    drain(fake_clock, horizon=0)
    StepAttempt.objects.filter(run_id=run_id, name="patch:use-c").update(name="patch:retired")
    tasks_engine.signal(run_id, "go")
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(run_id)
    # "use-c" has no marker now and "c" is recorded after its point: the history says the
    # code passed it without the patch -> old path; "c" unreached, the retired marker not.
    assert view.output == {"path": "old"}
    assert view.unreached_steps == ["c"]


# -- replay-check -----------------------------------------------------------------------------


def replay(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("tasks", "replay-check", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


def test_replay_check_passes_clean_runs_and_catches_a_rolled_back_deploy(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    for task in ("patched_flow", "kind_changes", "step_inserted"):
        tasks_engine.enqueue(task)
    drain(fake_clock, horizon=0)
    tasks_engine.enqueue("kind_changes")  # pending, never started: no history
    rc, out = replay()
    assert (rc, out.strip()) == (0, "all 4 unfinished runs match the code")
    code["code"] = "new"
    new = tasks_engine.enqueue("patched_flow").run_id
    drain(fake_clock, horizon=0)
    rc, out = replay("--task", "patched_flow")
    assert (rc, out.strip()) == (0, "all 2 unfinished runs match the code")
    code["code"] = "old"  # rolling the deploy back would break the run that took the patch
    rc, out = replay("--task", "patched_flow", "--json")
    assert (rc, json.loads(out)) == (
        1,
        [
            {
                "run_id": str(new),
                "task": "patched_flow",
                "version": 1,
                "problem": "recorded steps c, go no longer reached before new step 'b'",
            }
        ],
    )


def test_replay_check_catches_a_changed_step_kind_and_a_moved_step(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    kind = tasks_engine.enqueue("kind_changes").run_id
    moved = tasks_engine.enqueue("step_inserted").run_id
    fine = tasks_engine.enqueue("patched_flow").run_id
    drain(fake_clock, horizon=0)
    code["code"] = "new"
    rc, out = replay("--json")
    assert rc == 1
    found = {m["run_id"]: m for m in json.loads(out)}
    assert set(found) == {str(kind), str(moved)}
    assert found[str(kind)]["task"] == "kind_changes" and found[str(kind)]["version"] == 1
    assert (
        "'b' was recorded as 'function' but replay called it as 'sleep'"
        in found[str(kind)]["problem"]
    )
    assert found[str(moved)]["problem"] == (
        "recorded steps b, go no longer reached before new step 'x'"
    )
    assert str(fine) not in found
    rc, text = replay()
    assert rc == 1 and str(kind) in text and "2 of 3 unfinished runs" in text


def test_replay_check_reports_an_unknown_version(code: dict[str, str], fake_clock) -> None:
    run_id = tasks_engine.enqueue("patched_flow").run_id
    WorkflowRun.objects.filter(pk=run_id).update(version=7)
    rc, out = replay("--json")
    assert rc == 1
    assert json.loads(out) == [
        {
            "run_id": str(run_id),
            "task": "patched_flow",
            "version": 7,
            "problem": "no workflow patched_flow@7 is registered in this code",
        }
    ]


def test_replay_check_writes_nothing_and_reads_in_batches(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    for _ in range(5):
        tasks_engine.enqueue("patched_flow")
    drain(fake_clock, horizon=0)
    with CaptureQueriesContext(connection) as queries:
        checked, found = replay_check.check(batch=2)
    assert (checked, found) == (5, [])
    sql = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    assert set(sql) == {"SELECT"}
    assert len(sql) == 3 * 3  # runs, steps, ops: one query each per batch (2, 2, 1 runs)


def test_replay_check_refuses_writes_from_a_handler_between_steps(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    @tasks_engine.workflow(name="writes_outside_steps")
    def writes(ctx: tasks_engine.TaskContext) -> None:
        from tests.testapp.models import Marker

        Marker.objects.create(key=f"outside:{ctx.run_id}")
        ctx.step.wait_for_fact("go")

    try:
        tasks_engine.enqueue("writes_outside_steps")
        drain(fake_clock, horizon=0)
        before = WorkflowRun.objects.count()
        checked, found = replay_check.check("writes_outside_steps")
        assert checked == 1 and "writes to the database outside a step" in found[0].problem
        assert WorkflowRun.objects.count() == before
    finally:
        registry.unregister("writes_outside_steps", 1)


def test_replay_check_unknown_task_is_a_one_line_error(capsys) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="unknown task 'nope'"):
        call_command("tasks", "replay-check", "--task", "nope")


def test_replay_check_reports_removed_steps_and_input_the_model_refuses(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    removed = tasks_engine.enqueue("kind_changes").run_id
    drain(fake_clock, horizon=0)  # a, b, parked on "go"
    StepAttempt.objects.filter(run_id=removed, name="go").update(name="gone")
    invalid = tasks_engine.enqueue("timed_step", {"hangs": 0}).run_id
    WorkflowRun.objects.filter(pk=invalid).update(input={"timeout": "soon"})
    checked, found = replay_check.check()
    problems = {m.run_id: m.problem for m in found}
    assert checked == 2
    assert problems[removed] == "recorded step gone no longer reached before new step 'go'"
    assert problems[invalid].startswith("its input no longer validates: timeout:")


def test_replay_check_reports_a_handler_returning_before_recorded_steps(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    run_id = tasks_engine.enqueue("kind_changes").run_id
    drain(fake_clock, horizon=0)
    go = StepAttempt.objects.get(run_id=run_id, name="go")
    StepAttempt.objects.filter(pk=go.pk).update(status="completed", output=1)
    StepAttempt.objects.create(
        run_id=run_id, name="zzz", status="completed", output=2, started_at=go.started_at
    )
    [found] = replay_check.check()[1]
    assert found.problem == "the handler returns without reaching recorded steps zzz"


def test_replay_check_passes_a_run_an_operator_retried_that_no_worker_claimed_yet(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    """retry_run starts a fresh pass (failures 0, the passes so far in pass_offset): the
    replay reads the history in that pass, as the worker will, so the old pass's terminal
    error of "b" is not raised again (a worker runs "b" again)."""
    run_id = tasks_engine.enqueue("fails_at_b").run_id
    drain(fake_clock, horizon=0)
    assert tasks_engine.get_run(run_id).status == "failed"
    assert tasks_engine.retry_run(run_id, reason="fixed") is True
    rc, out = replay("--task", "fails_at_b")
    assert (rc, out.strip()) == (0, "all 1 unfinished runs match the code")
    # A second failure, a workflow retry and a second operator retry: still the worker's pass.
    drain(fake_clock, horizon=0)
    assert tasks_engine.retry_run(run_id, reason="again") is True
    assert replay("--task", "fails_at_b")[0] == 0
    code["code"] = "new"  # a real divergence after the retry is still reported
    rc, out = replay("--task", "fails_at_b", "--json")
    assert rc == 1
    assert [m["problem"] for m in json.loads(out)] == [
        "recorded step b no longer reached before new step 'x'"
    ]


def test_replay_check_and_the_worker_read_a_run_in_the_same_pass(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    from tasks_engine.states import current_pass

    run_id = tasks_engine.enqueue("fails_at_b").run_id
    drain(fake_clock, horizon=0)
    tasks_engine.retry_run(run_id)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.failures, run.pass_offset) == (0, 1)
    assert current_pass(run.failures, run.pass_offset) == 2
    drain(fake_clock, horizon=0)  # the worker's pass 2 fails "b" again
    assert set(
        StepAttempt.objects.filter(run_id=run_id, name="b").values_list("run_pass", flat=True)
    ) == {1, 2}


@pytest.mark.parametrize(
    ("deploy", "problem", "unreached"),
    [
        ("removed", "recorded step a no longer reached before step 'go'", ["a"]),
        ("moved", "recorded step a no longer reached before step 'go'", []),
        ("renamed", "recorded steps a, go no longer reached before new step 'a2'", ["a"]),
    ],
)
def test_replay_check_reports_a_step_passed_over_before_the_step_a_run_is_parked_on(
    code: dict[str, str], fake_clock: FakeClock, deploy: str, problem: str, unreached: list[str]
) -> None:
    """Parked on "go" after "a"; the new code no longer calls "a" before "go". The worker
    would carry on from "go" and complete without reaching "a" (removed, renamed) or replay
    "a"'s old result out of its place (moved): replay-check says so before the deploy."""
    run_id = tasks_engine.enqueue("parked_after_a").run_id
    drain(fake_clock, horizon=0)
    assert tasks_engine.get_run(run_id).status == "waiting"
    assert replay("--task", "parked_after_a")[0] == 0
    code["code"] = deploy
    rc, out = replay("--task", "parked_after_a", "--json")
    assert (rc, [m["problem"] for m in json.loads(out)]) == (1, [problem])
    tasks_engine.signal(run_id, "go")
    drain(fake_clock, horizon=0)
    view = tasks_engine.get_run(run_id)
    assert (view.status, view.unreached_steps) == ("completed", unreached)


def test_replay_check_ignores_steps_recorded_after_the_step_a_retried_pass_resumes_at(
    code: dict[str, str], fake_clock: FakeClock
) -> None:
    """Pass 1 recorded x (failed, caught) then y; pass 2 begins again at x: y is recorded but
    comes after x, not a step the code passed over."""
    run_id = tasks_engine.enqueue("caught_then_fails").run_id
    drain(fake_clock, horizon=0)
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.failures) == ("pending", 1)
    assert [n for n, _ in names(run_id)] == ["x", "y"]
    assert replay("--task", "caught_then_fails") == (0, "all 1 unfinished runs match the code\n")
