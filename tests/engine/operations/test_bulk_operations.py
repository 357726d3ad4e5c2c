"""cancel_runs and retry_runs: filters, batches, exact counts, the same paths as cancel and
retry_run; tags: the rule, defaults, inheritance, list_runs(tags=)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import tasks_engine
from tasks_engine import transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.operations import bulk
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def statuses() -> dict[str, int]:
    out: dict[str, int] = {}
    for status in WorkflowRun.objects.values_list("status", flat=True):
        out[status] = out.get(status, 0) + 1
    return out


def test_no_filter_is_a_value_error_and_changes_nothing() -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    for call in (tasks_engine.cancel_runs, tasks_engine.retry_runs):
        with pytest.raises(ValueError, match="at least one filter"):
            call()
        with pytest.raises(ValueError, match="at least one filter"):
            call(reason="why")
    assert statuses() == {"pending": 1}


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "done"},
        {"task": ""},
        {"queue": 7},
        {"created_before": datetime(2030, 1, 1)},  # naive
        {"tags": {"bad key": "v"}},
        {"tags": {}},
        {"task": "noop", "reason": 5},
    ],
)
def test_bad_filters_change_nothing(filters: dict) -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    with pytest.raises((ValueError, TypeError)):
        tasks_engine.cancel_runs(**filters)
    with pytest.raises((ValueError, TypeError)):
        tasks_engine.retry_runs(**filters)
    assert statuses() == {"pending": 1}


def test_cancel_runs_cancels_exactly_the_matching_unfinished_runs() -> None:
    for i in range(5):
        tasks_engine.enqueue("noop", {"n": i})
    tasks_engine.enqueue("noop", {"n": 9}, queue="other")
    tasks_engine.enqueue("b")
    assert tasks_engine.cancel_runs(task="noop", queue="default", reason="bulk") == 5
    canceled = WorkflowRun.objects.filter(status="canceled")
    assert set(canceled.values_list("cancel_reason", flat=True)) == {"bulk"}
    assert all(r.finished_at and r.cancel_requested_at for r in canceled)
    assert statuses() == {"canceled": 5, "pending": 2}
    assert tasks_engine.cancel_runs(task="noop", queue="default") == 0  # nothing left to change


def test_cancel_runs_works_in_batches_and_reports_progress(monkeypatch) -> None:
    monkeypatch.setattr(bulk, "BATCH", 7)
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(20)])
    seen: list[tuple[int, int]] = []
    assert tasks_engine.cancel_runs(task="noop", progress=lambda c, s: seen.append((c, s))) == 20
    assert seen == [(7, 7), (14, 14), (20, 20)]
    assert statuses() == {"canceled": 20}


def test_a_running_run_is_asked_to_stop_and_counted_once() -> None:
    tasks_engine.enqueue("noop", {"n": 1})
    tasks_engine.enqueue("noop", {"n": 2})
    [claimed] = transitions.claim_runs("w", [("noop", 1)], None, 1, 30)
    assert tasks_engine.cancel_runs(task="noop", reason="stop") == 2
    running = WorkflowRun.objects.get(pk=claimed.lease.run_id)
    assert running.status == "running" and running.cancel_requested_at is not None
    assert running.cancel_reason == "stop"
    assert tasks_engine.cancel_runs(task="noop") == 0  # already asked: nothing changes


def test_the_status_filter_and_created_before(fake_clock: FakeClock) -> None:
    old = tasks_engine.enqueue("noop", {"n": 1})
    fake_clock.advance(3600)
    tasks_engine.enqueue("noop", {"n": 2})
    cut = fake_clock.now() - timedelta(minutes=30)
    assert tasks_engine.cancel_runs(status="completed") == 0
    assert tasks_engine.cancel_runs(created_before=cut) == 1
    assert WorkflowRun.objects.get(pk=old.run_id).status == "canceled"
    assert statuses() == {"canceled": 1, "pending": 1}


def test_children_are_canceled_with_their_parent(fake_clock: FakeClock) -> None:
    parent = tasks_engine.enqueue("parent", {"value": 1, "sleep": 3600})
    drain(fake_clock, horizon=1)
    child = WorkflowRun.objects.get(parent_run_id=parent.run_id)
    assert (child.status, WorkflowRun.objects.get(pk=parent.run_id).status) == (
        "waiting",
        "waiting",
    )
    assert tasks_engine.cancel_runs(task="parent") == 1  # the runs that matched
    child.refresh_from_db()
    assert child.status == "canceled"
    assert child.cancel_reason == f"parent run {parent.run_id} canceled"


def test_cancel_runs_by_tags_needs_every_pair() -> None:
    a = tasks_engine.enqueue("noop", {"n": 1}, tags={"customer": "42", "env": "prod"})
    tasks_engine.enqueue("noop", {"n": 2}, tags={"customer": "42"})
    tasks_engine.enqueue("noop", {"n": 3}, tags={"customer": "43", "env": "prod"})
    assert tasks_engine.cancel_runs(tags={"customer": "42", "env": "prod"}) == 1
    assert WorkflowRun.objects.get(pk=a.run_id).status == "canceled"
    assert tasks_engine.cancel_runs(tags={"env": "prod"}) == 1
    assert statuses() == {"canceled": 2, "pending": 1}


def test_retry_runs_retries_failed_and_canceled_runs_as_retry_run_does(
    fake_clock: FakeClock,
) -> None:
    failed = [tasks_engine.enqueue("fatal").run_id for _ in range(3)]
    drain(fake_clock)
    single = tasks_engine.enqueue("fatal").run_id
    drain(fake_clock)
    canceled = tasks_engine.enqueue("fatal").run_id
    tasks_engine.cancel(canceled)
    tasks_engine.enqueue("noop", {"n": 1})  # pending: not retried
    assert tasks_engine.retry_run(single, reason="one", by="ann")
    assert tasks_engine.retry_runs(task="fatal", reason="all", by="bob") == 4
    for run_id in [*failed, canceled]:
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == "pending" and run.failures == 0 and run.error is None
        assert [(r["by"], r["reason"]) for r in run.retries] == [("bob", "all")]
    one, many = WorkflowRun.objects.get(pk=single), WorkflowRun.objects.get(pk=failed[0])
    assert (one.pass_offset, one.available_at is not None) == (many.pass_offset, True)
    assert tasks_engine.retry_runs(task="fatal") == 0  # all pending now
    drain(fake_clock)  # a fresh pass each: they fail again
    assert WorkflowRun.objects.filter(task_name="fatal", status="failed").count() == 5
    assert StepAttempt.objects.filter(run_id=failed[0], run_pass=2).exists(), (
        "the retried run ran a second pass"
    )


def test_retry_runs_leaves_a_child_whose_parent_finished(fake_clock: FakeClock) -> None:
    parent = tasks_engine.enqueue("parent", {"value": 1, "fail": True})
    drain(fake_clock)
    child = WorkflowRun.objects.get(parent_run_id=parent.run_id)
    assert (child.status, WorkflowRun.objects.get(pk=parent.run_id).status) == (
        "failed",
        "failed",
    )
    assert tasks_engine.retry_runs(task="child_echo") == 0
    assert tasks_engine.retry_runs(status="failed") == 1  # the parent alone
    assert WorkflowRun.objects.get(pk=parent.run_id).status == "pending"


# -- tags -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tags",
    [
        {"bad key": "v"},
        {"k" * 65: "v"},
        {"": "v"},
        {"k": 5},
        {"k": "v" * 257},
        {"k": "a\x00b"},
        {f"k{i}": "v" for i in range(17)},
        ["k", "v"],
        {5: "v"},
    ],
)
def test_bad_tags_are_a_value_error_and_write_nothing(tags) -> None:
    with pytest.raises(ValueError):
        tasks_engine.enqueue("noop", {"n": 1}, tags=tags)
    with pytest.raises(ValueError):
        tasks_engine.enqueue_many("noop", [{"n": 1}], tags=tags)
    assert WorkflowRun.objects.count() == 0


def test_the_longest_tags_are_stored() -> None:
    tags = {f"{i}" + "k" * 63: "v" * 256 for i in range(10)} | {"a.b-c_d": ""}
    res = tasks_engine.enqueue("noop", {"n": 1}, tags=tags)
    assert tasks_engine.get_run(res.run_id).tags == tags


def test_workflow_defaults_go_under_the_enqueues_own() -> None:
    res = tasks_engine.enqueue("tagged", {"n": 1}, tags={"tier": "2", "customer": "42"})
    assert tasks_engine.get_run(res.run_id).tags == {
        "team": "media",
        "tier": "2",
        "customer": "42",
    }
    plain = tasks_engine.enqueue("noop", {"n": 1})
    assert tasks_engine.get_run(plain.run_id).tags == {}
    assert WorkflowRun.objects.get(pk=plain.run_id).tags is None  # no entry in the tag index


def test_seventeen_pairs_with_the_defaults_are_refused() -> None:
    own = {f"k{i}": "v" for i in range(15)}
    with pytest.raises(ValueError, match="at most 16"):
        tasks_engine.enqueue("tagged", {"n": 1}, tags=own)
    assert WorkflowRun.objects.count() == 0


def test_a_workflow_with_bad_default_tags_is_refused_where_it_is_defined() -> None:
    with pytest.raises(ValueError, match="workflow tags"):
        tasks_engine.workflow(name="bad-tags", tags={"no spaces": "x"})(lambda ctx: None)


def test_a_child_inherits_its_parents_tags(fake_clock: FakeClock) -> None:
    parent = tasks_engine.enqueue("parent", {"value": 2}, tags={"customer": "42"})
    drain(fake_clock)
    child = WorkflowRun.objects.get(parent_run_id=parent.run_id)
    assert child.tags == {"customer": "42"}
    assert tasks_engine.get_run(parent.run_id).status == "completed"


def test_list_runs_by_tags() -> None:
    a = tasks_engine.enqueue("noop", {"n": 1}, tags={"customer": "42", "env": "prod"})
    b = tasks_engine.enqueue("noop", {"n": 2}, tags={"customer": "42"})
    tasks_engine.enqueue("noop", {"n": 3})
    weird = tasks_engine.enqueue("noop", {"n": 4}, tags={"a__b": "x", "c.d": "y"})
    found = tasks_engine.list_runs(tags={"customer": "42"})
    assert {v.run_id for v in found} == {a.run_id, b.run_id}
    assert [v.run_id for v in tasks_engine.list_runs(tags={"customer": "42", "env": "prod"})] == [
        a.run_id
    ]
    assert [v.run_id for v in tasks_engine.list_runs(tags={"a__b": "x", "c.d": "y"})] == [
        weird.run_id
    ]
    assert tasks_engine.list_runs(tags={"customer": "4"}) == []
    assert found[0].tags in ({"customer": "42", "env": "prod"}, {"customer": "42"})
    with pytest.raises(ValueError):
        tasks_engine.list_runs(tags={"bad key": "1"})


def test_tags_are_not_matched_by_type_or_prefix() -> None:
    tasks_engine.enqueue("noop", {"n": 1}, tags={"n": "1"})
    assert tasks_engine.list_runs(tags={"n": "1"})
    assert tasks_engine.cancel_runs(tags={"n": "1 "}) == 0
    assert tasks_engine.cancel_runs(tags={"n": "1"}) == 1


def test_enqueue_many_tags_and_created_before_default() -> None:
    now = datetime.now(UTC)
    tasks_engine.enqueue_many("noop", [{"n": i} for i in range(3)], tags={"batch": "7"})
    assert tasks_engine.cancel_runs(tags={"batch": "7"}, created_before=now) == 0
    assert tasks_engine.cancel_runs(tags={"batch": "7"}) == 3
