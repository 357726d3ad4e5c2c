"""Group commit on SQLite (a worker's async runs): several runs' hot writes in one
transaction, each in a savepoint, each keeping its own fence; settled once committed."""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, connection

import tasks_engine
from tasks_engine import LeaseLostError, clock, transitions
from tasks_engine.models import StepAttempt, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)  # the group's own BEGIN IMMEDIATE

PAIRS = [("bench_noop", 1)]


@pytest.fixture(autouse=True)
def _sqlite_only() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL groups are one statement (test_group_commit.py)")


def claim(n: int) -> list[transitions.Claimed]:
    for _ in range(n):
        tasks_engine.enqueue("bench_noop")
    return transitions.claim_runs("w", PAIRS, None, n, 30)


def start(c: transitions.Claimed, name: str = "noop") -> transitions.HotWrite:
    return transitions.HotWrite("start", c.lease, (), clock.now(), name, attempt=1, run_pass=1)


def complete(c: transitions.Claimed, deferred=()) -> transitions.HotWrite:
    write = transitions.HotWrite("complete", c.lease, deferred, clock.now())
    write.output = {"done": str(c.lease.run_id)}
    return write


def test_a_group_writes_every_write_and_a_lost_fence_fails_alone() -> None:
    first = claim(3)
    starts = [start(c) for c in first]
    transitions.write_group_sqlite(starts)
    assert all(isinstance(w.result, int) and w.error is None for w in starts)
    lost = first[1]
    WorkflowRun.objects.filter(pk=lost.lease.run_id).update(lease_token=uuid.uuid4())
    ended: list[str | None] = []
    completes = []
    for c, w in zip(first, starts, strict=True):
        write = complete(c, (transitions.Completion(w.result, {"n": 1}, clock.now()),))
        write.ended = ended.append
        c.lease.deferred.put(w.result, {"n": 1})
        completes.append(write)
    transitions.write_group_sqlite(completes)
    assert isinstance(completes[1].error, LeaseLostError)
    assert [completes[0].result, completes[2].result] == ["completed", "completed"]
    assert ended == ["completed", "completed"]  # told once committed; the lost one not
    statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
    assert statuses[first[1].lease.run_id] == "running"  # the lost attempt wrote nothing
    assert statuses[first[0].lease.run_id] == statuses[first[2].lease.run_id] == "completed"
    steps = dict(StepAttempt.objects.values_list("run_id", "status"))
    assert steps[first[1].lease.run_id] == "running"
    assert steps[first[0].lease.run_id] == steps[first[2].lease.run_id] == "completed"


def test_a_refused_row_fails_its_write_alone_and_the_group_commits() -> None:
    [c] = claim(1)
    again = start(c)  # the same step attempt twice: step_attempt_unique refuses the second
    writes = [start(c), again, start(c, "other")]
    transitions.write_group_sqlite(writes)
    assert isinstance(again.error, IntegrityError)
    assert writes[0].error is None and writes[2].error is None
    assert sorted(StepAttempt.objects.values_list("name", flat=True)) == ["noop", "other"]
