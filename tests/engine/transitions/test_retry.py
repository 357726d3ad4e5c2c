"""retry_run: a failed or canceled run gets a fresh pass; completed steps do not run again;
from_step reruns that step and every later one, keeping the old attempts as superseded."""

from __future__ import annotations

import json
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

import tasks_engine
from tasks_engine import UnknownRunError, UnknownStepError
from tasks_engine.models import Fact, StepAttempt, WorkflowRun
from tests.helpers import FakeClock, drain
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


def effects(key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in SideEffect.objects.filter(key__startswith=f"{key}:").values_list("key", flat=True):
        out[k.split(":")[-1]] = out.get(k.split(":")[-1], 0) + 1
    return out


def failed_gated(fake: FakeClock, key: str = "g", **extra: Any) -> uuid.UUID:
    run_id = tasks_engine.enqueue("gated", {"key": key, **extra}).run_id
    drain(fake)
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    return run_id


def open_gate(key: str = "g") -> None:
    Marker.objects.create(key=f"{key}:open")


def columns(run_id: uuid.UUID) -> tuple:
    run = WorkflowRun.objects.get(pk=run_id)
    steps = list(
        StepAttempt.objects.filter(run_id=run_id).values_list("id", "status", "superseded")
    )
    return (run.status, run.updated_at, run.error, run.retries, steps)


def test_a_failed_run_reruns_its_failed_step_and_not_its_completed_one(
    fake_clock: FakeClock,
) -> None:
    run_id = failed_gated(fake_clock)
    assert effects("g") == {"a": 1, "b": 1}
    open_gate()
    assert tasks_engine.retry_run(str(run_id), reason="gate fixed") is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.error, run.finished_at, run.output) == ("pending", None, None, None)
    assert run.available_at == fake_clock.now()
    assert run.worker_id == ""  # the failed pass's worker holds nothing; a claim sets it again
    drain(fake_clock)
    view = tasks_engine.get_run(run_id)
    assert view is not None
    assert (view.status, view.output) == ("completed", {"done": ["a", "b", "c"]})
    assert effects("g") == {"a": 1, "b": 2, "c": 1}
    assert [(s.name, s.status, s.superseded) for s in view.steps] == [
        ("a", "completed", False),
        ("b", "failed", False),
        ("b", "completed", False),
        ("c", "completed", False),
    ]
    assert [(r["reason"], r["from_step"]) for r in view.retries] == [("gate fixed", None)]
    assert view.retries[0]["at"] == fake_clock.now().isoformat()


def test_retry_from_a_step_reruns_it_and_every_later_step(fake_clock: FakeClock) -> None:
    run_id = failed_gated(fake_clock, gate_step="c")
    assert effects("g") == {"a": 1, "b": 1, "c": 1}
    open_gate()
    assert tasks_engine.retry_run(run_id, from_step="b", reason="redo b") is True
    superseded = StepAttempt.objects.filter(run_id=run_id, superseded=True)
    assert sorted(superseded.values_list("name", "status")) == [
        ("b", "completed"),
        ("c", "failed"),
    ]
    drain(fake_clock)
    view = tasks_engine.get_run(run_id)
    assert view is not None and view.status == "completed"
    assert effects("g") == {"a": 1, "b": 2, "c": 2}  # a was not run again
    assert [(s.name, s.status, s.attempt, s.superseded) for s in view.steps] == [
        ("a", "completed", 1, False),
        ("b", "completed", 1, True),
        ("c", "failed", 1, True),
        ("b", "completed", 2, False),
        ("c", "completed", 2, False),
    ]
    assert view.unreached_steps == []


def test_retry_from_the_first_step_of_a_completed_history_reruns_all(
    fake_clock: FakeClock,
) -> None:
    run_id = failed_gated(fake_clock)
    open_gate()
    assert tasks_engine.retry_run(run_id, from_step="a") is True
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    assert effects("g") == {"a": 2, "b": 2, "c": 1}
    assert tasks_engine.retry_run(run_id) is False  # completed now


def test_retry_twice_from_a_step_keeps_every_old_attempt(fake_clock: FakeClock) -> None:
    run_id = failed_gated(fake_clock)
    assert tasks_engine.retry_run(run_id, from_step="a") is True
    drain(fake_clock)  # the gate is still closed: fails again at b
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    open_gate()
    assert tasks_engine.retry_run(run_id, from_step="a") is True
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    assert effects("g") == {"a": 3, "b": 3, "c": 1}
    rows = list(StepAttempt.objects.filter(run_id=run_id).values_list("name", "attempt"))
    assert len(rows) == len(set(rows)) == 7
    assert StepAttempt.objects.filter(run_id=run_id, superseded=True).count() == 4
    assert len(WorkflowRun.objects.get(pk=run_id).retries or []) == 2


def test_retry_from_a_fact_wait_takes_the_same_fact_again(fake_clock: FakeClock) -> None:
    run_id = tasks_engine.enqueue("gated", {"key": "f", "wait_fact": True}).run_id
    drain(fake_clock)
    assert tasks_engine.signal(run_id, "go", {"n": 1}).delivered
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    open_gate("f")
    assert tasks_engine.retry_run(run_id, from_step="go") is True
    assert Fact.objects.get(run_id=run_id).consumed_by == ""
    drain(fake_clock)
    view = tasks_engine.get_run(run_id)
    assert view is not None
    assert (view.status, view.output) == ("completed", {"done": ["a", {"n": 1}, "b", "c"]})
    assert Fact.objects.get(run_id=run_id).consumed_by == "go"


def test_a_canceled_run_is_retried(fake_clock: FakeClock) -> None:
    run_id = tasks_engine.enqueue("gated", {"key": "c", "wait_fact": True}).run_id
    drain(fake_clock)
    assert tasks_engine.cancel(run_id, "oops") is True
    open_gate("c")
    assert tasks_engine.retry_run(run_id, reason="not meant") is True
    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.status, run.cancel_requested_at, run.cancel_reason) == ("pending", None, "")
    assert tasks_engine.signal(run_id, "go").delivered  # cancel no longer refuses it
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "completed"
    assert effects("c") == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("status", ["pending", "waiting", "completed"])
def test_retry_of_an_unfinished_or_completed_run_changes_nothing(
    fake_clock: FakeClock, status: str
) -> None:
    open_gate("s")
    run_id = tasks_engine.enqueue("gated", {"key": "s", "wait_fact": True}).run_id
    if status != "pending":
        drain(fake_clock)
    if status == "completed":
        tasks_engine.signal(run_id, "go")
        drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == status
    before = columns(run_id)
    assert tasks_engine.retry_run(run_id, reason="no") is False
    # Any other status answers False with from_step too, even one the run never recorded.
    assert tasks_engine.retry_run(run_id, from_step="nosuch") is False
    assert columns(run_id) == before


def test_retry_of_a_running_run_changes_nothing(fake_clock: FakeClock) -> None:
    from tasks_engine import transitions
    from tasks_engine.definitions import registry

    run_id = tasks_engine.enqueue("gated", {"key": "r"}).run_id
    assert transitions.claim_runs("w", registry.pairs(), None, 1, 30.0)
    before = columns(run_id)
    assert before[0] == "running"
    assert tasks_engine.retry_run(run_id) is False
    assert columns(run_id) == before


def test_unknown_run_and_unknown_step(fake_clock: FakeClock) -> None:
    with pytest.raises(UnknownRunError):
        tasks_engine.retry_run(uuid.uuid4())
    with pytest.raises(UnknownRunError):
        tasks_engine.retry_run("not-a-uuid")
    run_id = failed_gated(fake_clock)
    before = columns(run_id)
    with pytest.raises(UnknownStepError, match=r"no step 'zzz'.*a, b"):
        tasks_engine.retry_run(run_id, from_step="zzz")
    with pytest.raises(ValueError):
        tasks_engine.retry_run(run_id, from_step="")
    assert columns(run_id) == before


def test_an_idempotent_enqueue_gets_the_failed_run_and_retry_recovers_it(
    fake_clock: FakeClock,
) -> None:
    first = tasks_engine.enqueue("gated", {"key": "k"}, idempotency_key="plan:1")
    drain(fake_clock)
    again = tasks_engine.enqueue("gated", {"key": "k"}, idempotency_key="plan:1")
    assert (again.run_id, again.deduplicated) == (first.run_id, True)
    assert WorkflowRun.objects.get(pk=first.run_id).status == "failed"
    open_gate("k")
    assert tasks_engine.retry_run(again.run_id) is True
    drain(fake_clock)
    run = WorkflowRun.objects.get(pk=first.run_id)
    assert (run.status, run.idempotency_key) == ("completed", "plan:1")
    assert tasks_engine.enqueue("gated", {"key": "k"}, idempotency_key="plan:1") == again
    assert WorkflowRun.objects.filter(idempotency_key="plan:1").count() == 1


def test_a_retried_run_gets_its_workflow_retry_budget_again(fake_clock: FakeClock) -> None:
    run_id = tasks_engine.enqueue("gated_retrying", {"key": "w"}).run_id
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    assert effects("w") == {"a": 1, "b": 2}  # two passes: the workflow's retry policy
    assert tasks_engine.retry_run(run_id)
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).status == "failed"
    assert effects("w") == {"a": 1, "b": 4}  # two more passes, each a fresh one
    passes = StepAttempt.objects.filter(run_id=run_id, name="b").values_list("run_pass", flat=True)
    assert sorted(passes) == [1, 2, 3, 4]


def test_a_retried_child_keeps_its_waiting_parent_waiting(fake_clock: FakeClock) -> None:
    parent_id = tasks_engine.enqueue("parent", {"value": 2, "fail": True}).run_id
    drain(fake_clock, pairs=[("parent", 1)])
    child = WorkflowRun.objects.get(parent_run_id=parent_id)
    drain(fake_clock, pairs=[("child_echo", 1)])
    child.refresh_from_db()
    assert child.status == "failed"
    assert WorkflowRun.objects.get(pk=parent_id).status == "pending"  # woken by the failure
    # The operator fixes the child's input problem by retrying it (here: flip its input).
    WorkflowRun.objects.filter(pk=child.pk).update(input={"value": 2, "fail": False})
    assert tasks_engine.retry_run(child.pk)
    drain(fake_clock, pairs=[("parent", 1)])  # the parent finds its child unfinished
    parent = WorkflowRun.objects.get(pk=parent_id)
    assert (parent.status, parent.waiting_on) == ("waiting", f"child:{child.pk}")
    drain(fake_clock)
    parent.refresh_from_db()
    assert (parent.status, parent.output) == ("completed", {"child": {"double": 4}})


def canceled_family(fake: FakeClock) -> tuple[uuid.UUID, uuid.UUID]:
    """A parent canceled while its child slept: both end canceled."""
    parent_id = tasks_engine.enqueue("parent", {"value": 2, "sleep": 3600}).run_id
    drain(fake)
    child = WorkflowRun.objects.get(parent_run_id=parent_id)
    assert child.status == "waiting"
    assert tasks_engine.cancel(parent_id, "not wanted") is True
    child.refresh_from_db()
    assert (WorkflowRun.objects.get(pk=parent_id).status, child.status) == ("canceled", "canceled")
    return parent_id, child.pk


def test_a_child_of_a_canceled_parent_is_not_retried(fake_clock: FakeClock) -> None:
    parent_id, child_id = canceled_family(fake_clock)
    before = columns(child_id), columns(parent_id)
    assert tasks_engine.retry_run(child_id, reason="alone") is False
    assert (columns(child_id), columns(parent_id)) == before
    # The parent's retry is the way: its fresh pass starts its child again.
    assert tasks_engine.retry_run(parent_id, reason="wanted after all") is True
    drain(fake_clock, horizon=7200)
    parent = WorkflowRun.objects.get(pk=parent_id)
    assert (parent.status, parent.output) == ("completed", {"child": {"double": 4}})
    assert WorkflowRun.objects.get(pk=child_id).status == "canceled"  # the old one stays so


def test_a_child_of_a_failed_parent_is_not_retried(fake_clock: FakeClock) -> None:
    parent_id = tasks_engine.enqueue("parent", {"value": 2, "fail": True}).run_id
    drain(fake_clock)
    child_id = WorkflowRun.objects.get(parent_run_id=parent_id).pk
    assert WorkflowRun.objects.get(pk=parent_id).status == "failed"
    assert WorkflowRun.objects.get(pk=child_id).status == "failed"
    before = columns(child_id), columns(parent_id)
    assert tasks_engine.retry_run(child_id) is False
    assert tasks_engine.retry_run(child_id, from_step="nosuch") is False
    assert (columns(child_id), columns(parent_id)) == before


# -- CLI ------------------------------------------------------------------------------------


def tasks(*args: str) -> str:
    out = StringIO()
    call_command("tasks", *args, stdout=out)
    return out.getvalue()


def test_cli_retry(fake_clock: FakeClock) -> None:
    run_id = failed_gated(fake_clock, gate_step="c")
    open_gate()
    out = json.loads(tasks("retry", str(run_id), "--from-step", "b", "--reason", "cli", "--json"))
    assert out == {"retried": True}
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.retries[0]["reason"] == "cli" and run.retries[0]["by"].startswith("cli")
    assert json.loads(tasks("retry", str(run_id), "--json")) == {"retried": False}
    drain(fake_clock)
    assert effects("g") == {"a": 1, "b": 2, "c": 2}
    text = tasks("inspect", str(run_id))
    assert "(superseded)" in text and "from step b: cli" in text
    assert tasks("retry", str(run_id)).startswith("not retried")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["retry", str(uuid.UUID(int=7))], "no run with id"),
        (["retry", "nope"], "not a UUID"),
    ],
)
def test_cli_retry_errors(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        tasks(*args)


def test_cli_retry_of_a_child_of_a_canceled_parent_says_why(fake_clock: FakeClock) -> None:
    parent_id, child_id = canceled_family(fake_clock)
    before = columns(child_id)
    assert json.loads(tasks("retry", str(child_id), "--json")) == {"retried": False}
    text = tasks("retry", str(child_id))
    assert text.strip() == (
        f"not retried: its parent run {parent_id} is canceled; retry the parent instead"
    )
    assert columns(child_id) == before


def test_cli_retry_unknown_step_changes_nothing(fake_clock: FakeClock) -> None:
    run_id = failed_gated(fake_clock)
    before = columns(run_id)
    with pytest.raises(CommandError, match="no step 'x'"):
        tasks("retry", str(run_id), "--from-step", "x")
    assert columns(run_id) == before


def test_a_limit_past_64_bits_lists_every_run_instead_of_crashing() -> None:
    """`tasks list --limit N` (and list_runs) with N of 2**63 or more: every run, as with any
    limit above the number of runs. It was a traceback from the database (bigint out of
    range on PostgreSQL, a datatype mismatch on SQLite)."""
    one = tasks_engine.enqueue("a", {}, version=1).run_id
    for limit in (2**63 - 1, 2**63, 10**30):
        assert [v.run_id for v in tasks_engine.list_runs(limit=limit)] == [one]
        listed = json.loads(tasks("list", "--limit", str(limit), "--version", "1", "--json"))
        assert [r["run_id"] for r in listed] == [str(one)]


def test_list_runs_by_version() -> None:
    one = tasks_engine.enqueue("a", {}, version=1).run_id
    two = tasks_engine.enqueue("a", {}, version=2).run_id
    assert [v.run_id for v in tasks_engine.list_runs(task="a", version=1)] == [one]
    assert [v.run_id for v in tasks_engine.list_runs(version=2)] == [two]
    listed = json.loads(tasks("list", "--task", "a", "--version", "2", "--json"))
    assert [r["run_id"] for r in listed] == [str(two)]
    with pytest.raises(ValueError):
        tasks_engine.list_runs(version="2")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        tasks("list", "--version", "x")


def test_a_reason_with_a_nul_character_is_refused_and_nothing_changes(
    fake_clock: FakeClock,
) -> None:
    rid = failed_gated(fake_clock)
    with pytest.raises(ValueError, match="NUL"):
        tasks_engine.retry_run(rid, reason="a\x00b")
    assert WorkflowRun.objects.get(pk=rid).status == "failed"
    waiting = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(ValueError, match="NUL"):
        tasks_engine.cancel(waiting, reason="a\x00b")
    assert WorkflowRun.objects.get(pk=waiting).cancel_requested_at is None


def test_a_reason_longer_than_the_limit_is_refused_and_nothing_changes(
    fake_clock: FakeClock,
) -> None:
    """100,000 characters were accepted, stored and shown; REASON_MAX_LENGTH (2,000) is the
    longest, in the API and on the command line alike."""
    from tasks_engine.values.serialization import REASON_MAX_LENGTH

    assert REASON_MAX_LENGTH == 2000
    long = "r" * (REASON_MAX_LENGTH + 1)
    message = "reason is 2001 characters long: at most 2000"
    rid = failed_gated(fake_clock)
    before = columns(rid)
    with pytest.raises(ValueError, match=message):
        tasks_engine.retry_run(rid, reason=long)
    with pytest.raises(CommandError, match=message):
        tasks("retry", str(rid), "--reason", long)
    assert columns(rid) == before
    waiting = tasks_engine.enqueue("fact_waiter").run_id
    with pytest.raises(ValueError, match=message):
        tasks_engine.cancel(waiting, reason=long)
    with pytest.raises(CommandError, match="reason is 100000 characters long: at most 2000"):
        tasks("cancel", str(waiting), "--reason", "r" * 100_000)
    run = WorkflowRun.objects.get(pk=waiting)
    assert (run.status, run.cancel_requested_at, run.cancel_reason) == ("pending", None, "")
    assert tasks_engine.retry_run(rid, reason="r" * REASON_MAX_LENGTH) is True
    assert tasks_engine.cancel(waiting, reason="r" * REASON_MAX_LENGTH) is True
