"""A claim that starts the first step of a fresh run (transitions/first_steps.py): the guess,
its use by the step, and every way it can be wrong. PostgreSQL claims guess; SQLite's never do."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import tasks_engine
from tasks_engine import transitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.runtime import executor
from tasks_engine.transitions import claim_mode, first_steps
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def claim_one(task: str, worker: str = "w") -> transitions.Claimed:
    [claimed] = transitions.claim_runs(worker, [(task, 1)], None, 1, 30)
    return claimed


def execute(claimed: transitions.Claimed) -> tuple[str, int]:
    """The pass's outcome and the statements it sent."""
    with CaptureQueriesContext(connection) as q:
        wf, ctx = executor.build_context(
            claimed.run, claimed.lease, threading.Event(), claimed.prestarted
        )
        outcome = executor.execute(claimed.run, wf, ctx)
    return outcome, len(q)


def attempts(run_id: uuid.UUID) -> list[tuple[str, int, str]]:
    rows = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    return list(rows.values_list("name", "attempt", "status"))


def learn_first(task: str, payload: dict | None = None) -> None:
    """One fresh run of `task` taught the worker its first step."""
    tasks_engine.enqueue(task, payload or {})
    assert execute(claim_one(task))[0] == "completed"


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL claims start a first step (SQLite: tested below)")


@pytest.mark.usefixtures("postgres_only")
def test_a_learned_first_step_is_started_by_the_claim_and_taken_by_the_step() -> None:
    learn_first("noop", {"n": 0})
    assert first_steps.guess("noop", 1) == "only"
    res = tasks_engine.enqueue("noop", {"n": 1})
    claimed = claim_one("noop")
    assert claimed.prestarted is not None and claimed.prestarted[0] == "only"
    step = StepAttempt.objects.get(pk=claimed.prestarted[1])
    # Durable before the slot runs anything, under the claim's own lease token.
    assert (step.run_id, step.name, step.attempt, step.status) == (res.run_id, "only", 1, "running")
    assert step.lease_token == claimed.lease.token and step.worker_id == "w"
    outcome, sent = execute(claimed)
    assert outcome == "completed"
    # The step's body writes one row; its completion rides on the run's: no start statement.
    assert sent == 2, sent
    assert attempts(res.run_id) == [("only", 1, "completed")]


@pytest.mark.usefixtures("postgres_only")
@pytest.mark.parametrize("first", ["b", "sleep", ""], ids=["another-step", "a-sleep", "no-step"])
def test_a_wrong_guess_leaves_no_trace_and_is_not_made_again(
    first: str, fake_clock: FakeClock
) -> None:
    learn_first("first_step_varies", {"first": "a"})
    res = tasks_engine.enqueue("first_step_varies", {"first": first})
    claimed = claim_one("first_step_varies")
    assert claimed.prestarted is not None and claimed.prestarted[0] == "a"
    execute(claimed)
    drain(fake_clock)
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed", view.error
    names = [name for name, _, _ in attempts(res.run_id)]
    assert "a" not in names, attempts(res.run_id)
    assert all(status == "completed" for _, _, status in attempts(res.run_id))
    assert first_steps.guess("first_step_varies", 1) is None
    tasks_engine.enqueue("first_step_varies", {"first": "a"})
    assert claim_one("first_step_varies").prestarted is None  # never guessed again here


@pytest.mark.usefixtures("postgres_only")
def test_no_guess_for_a_run_whose_cancel_or_deadline_came_first_or_that_ran_before(
    fake_clock: FakeClock,
) -> None:
    learn_first("noop", {"n": 0})
    again = tasks_engine.enqueue("noop", {"n": 3})
    [c] = transitions.claim_runs("crashed", [("noop", 1)], None, 1, 30)  # its worker dies
    assert c.run.pk == again.run_id and c.prestarted is not None
    canceled = tasks_engine.enqueue("noop", {"n": 1})
    tasks_engine.cancel(canceled.run_id)
    soon = fake_clock.now() + timedelta(seconds=1)
    late = tasks_engine.enqueue("noop", {"n": 2}, deadline_at=soon)
    fake_clock.advance(31)
    for claimed in transitions.claim_runs("w", [("noop", 1)], None, 10, 30):
        assert claimed.prestarted is None, claimed.run.pk
        execute(claimed)
    assert tasks_engine.get_run(late.run_id).status == "failed"
    assert attempts(late.run_id) == []
    # The crashed worker's prestarted attempt counts as any crash's; the next one completes.
    rows = StepAttempt.objects.filter(run_id=again.run_id).order_by("attempt")
    assert [(s.attempt, s.status, s.counted) for s in rows] == [
        (1, "abandoned", True),
        (2, "completed", True),
    ]
    assert tasks_engine.get_run(again.run_id).status == "completed"
    assert not WorkflowRun.objects.filter(pk=canceled.run_id).exclude(status="canceled").exists()


def test_sqlite_claims_never_guess() -> None:
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's claim")
    learn_first("noop", {"n": 0})
    tasks_engine.enqueue("noop", {"n": 1})
    claimed = claim_one("noop")
    assert claimed.prestarted is None
    assert execute(claimed)[0] == "completed"


@pytest.mark.usefixtures("postgres_only")
def test_a_group_that_claims_along_starts_the_first_steps_too() -> None:
    """The group writer's claim (worker/group_commit.py) starts first steps in the statement
    that completes the runs before them; the slot's run then takes them."""
    learn_first("noop", {"n": 0})
    done = tasks_engine.enqueue("noop", {"n": 1})
    nxt = [tasks_engine.enqueue("noop", {"n": n}) for n in (2, 3)]
    first = claim_one("noop")
    assert first.run.pk == done.run_id
    execute(first)
    request = transitions.ClaimRequest("w2", [("noop", 1)], None, 2, 30)
    at = timezone.now()
    with CaptureQueriesContext(connection) as q:
        claimed = transitions.write_group(
            [transitions.HotWrite("deferred", first.lease, (), at)], request
        )
    assert len(q) == 1
    assert {c.run.pk for c in claimed} == {r.run_id for r in nxt}
    for c in claimed:
        assert c.prestarted is not None and c.prestarted[0] == "only"
        assert execute(c)[0] == "completed"
        assert attempts(c.run.pk) == [("only", 1, "completed")]


@pytest.mark.usefixtures("postgres_only")
def test_a_group_with_nothing_to_write_sends_no_statement_and_its_guarded_claim_still_runs() -> (
    None
):
    """With a keyed run seen, the group's claim is guarded: it runs after the group's own
    statement, which here has nothing to write. That statement was an empty `WITH` (a
    syntax error from the server); now nothing is sent for it."""
    done = tasks_engine.enqueue("noop", {"n": 1})
    first = claim_one("noop")
    assert first.run.pk == done.run_id
    execute(first)
    nxt = tasks_engine.enqueue("noop", {"n": 2}, concurrency_key="k").run_id  # guarded now
    assert claim_mode.guarded([("noop", 1)], None)
    request = transitions.ClaimRequest("w2", [("noop", 1)], None, 2, 30)
    write = transitions.HotWrite("deferred", first.lease, (), timezone.now())
    claimed = transitions.write_group([write], request)
    assert write.error is None and write.result is True
    assert [c.run.pk for c in claimed] == [nxt]


@pytest.mark.usefixtures("postgres_only")
def test_a_guarded_claim_starts_the_first_steps_too(settings: Any, fake_clock: FakeClock) -> None:
    """The claim that flow control guards (transitions/flow_claims_pg.py) starts a learned first
    step like the plain claim, in its own statement: for a keyed run and for a run of a limited
    queue; never for a run that ran before (a reclaimed lease)."""
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"flow-io": {"concurrency": 5}}}
    try:
        for task, payload in (("flow-disk", {"disk": "a"}), ("flow-plain", {})):
            learn_first(task, payload)
            assert first_steps.guess(task, 1) == "work"
        keyed = tasks_engine.enqueue("flow-disk", {"disk": "b"})
        limited = tasks_engine.enqueue("flow-plain", {})
        pairs = [("flow-disk", 1), ("flow-plain", 1)]
        with CaptureQueriesContext(connection) as q:
            claimed = transitions.claim_runs("w", pairs, None, 10, 30)
        assert any("tasks_engine.flow_keys" in s["sql"] for s in q.captured_queries)  # guarded
        by_run = {c.run.pk: c for c in claimed}
        assert set(by_run) == {keyed.run_id, limited.run_id}
        for run_id in (keyed.run_id, limited.run_id):
            c = by_run[run_id]
            assert c.prestarted is not None and c.prestarted[0] == "work"
            step = StepAttempt.objects.get(pk=c.prestarted[1])
            assert (step.run_id, step.attempt, step.status) == (run_id, 1, "running")
            assert step.lease_token == c.lease.token
        assert execute(by_run[limited.run_id])[0] == "completed"
        assert attempts(limited.run_id) == [("work", 1, "completed")]
        # The keyed run's worker dies; its reclaim (an expired lease) starts nothing.
        fake_clock.advance(31)
        [again] = transitions.claim_runs("w2", pairs, None, 10, 30)
        assert again.run.pk == keyed.run_id and again.prestarted is None
        assert execute(again)[0] == "completed"
        assert [(a, s) for _, a, s in attempts(keyed.run_id)] == [
            (1, "abandoned"),
            (2, "completed"),
        ]
    finally:
        claim_mode.forget_keyed()
