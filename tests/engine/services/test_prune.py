"""Pruning in batches: each batch of runs (with steps, facts and ledger rows) is its own short
transaction, on both databases; dispatched outbox events likewise."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tasks_engine
from outbox import publish
from outbox.maintenance import prune_dispatched
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tasks_engine import clock, transitions
from tasks_engine.db import partitions
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tasks_engine.services import retention
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db

RUN = WorkflowRun._meta.db_table
EVENT = OutboxEvent._meta.db_table


def attach(run_id: uuid.UUID, n: int) -> None:
    """A fact and an op-ledger entry for the run, as signal() and with_attempt_token() write."""
    now = clock.now()
    Fact.objects.create(run_id=run_id, name="f", payload={"n": n}, created_at=now)
    OpLedger.objects.create(
        op_key=f"op:{run_id}",
        run_id=run_id,
        attempt_token=uuid.uuid4(),
        status=OpLedger.Status.DONE,
        created_at=now,
        updated_at=now,
    )


def counted(**counts: int) -> dict[str, int]:
    """What prune reports: on partitioned tables (TASKS_PARTITION) also the periods it dropped,
    none here (every run is of the current period, which has not ended)."""
    return {**counts, "partitions": 0} if partitions.unit() is not None else counts


def transactions(queries: list[dict[str, str]]) -> list[list[str]]:
    """The captured statements, cut where a transaction (or, inside the test's own transaction,
    a savepoint) begins."""
    parts: list[list[str]] = []
    for q in queries:
        sql = q["sql"]
        if sql.startswith(("BEGIN", "SAVEPOINT")) or not parts:
            parts.append([])
        parts[-1].append(sql)
    return parts


def deletes_from(table: str, sql: str) -> bool:
    return re.match(rf'DELETE FROM "?{table}"?\s', sql) is not None


def mentioned(sql: str, ids: list[uuid.UUID]) -> int:
    return sum(1 for i in ids if i.hex in sql or str(i) in sql)


def test_prune_deletes_old_finished_runs_in_batches_with_their_rows(fake_clock: FakeClock) -> None:
    old = [tasks_engine.enqueue("three_steps", {"n": i}).run_id for i in range(10)]
    assert drain(fake_clock).count("completed") == 10
    for i, run_id in enumerate(old):
        attach(run_id, i)
    fake_clock.advance(3 * 86400)
    recent = tasks_engine.enqueue("three_steps").run_id
    drain(fake_clock)
    attach(recent, 99)
    unfinished = tasks_engine.enqueue("noop", available_at=fake_clock.now() + timedelta(days=9))
    orphan = OpLedger.objects.create(
        op_key="op:no-run",
        attempt_token=uuid.uuid4(),
        status=OpLedger.Status.DONE,
        created_at=clock.now(),
        updated_at=clock.now(),
    )

    with CaptureQueriesContext(connection) as captured:
        counts = retention.prune(timedelta(days=2), batch=3)

    assert counts == counted(runs=10, steps=30, facts=10, ledger=10, outbox_events=0, rate_keys=0)
    assert set(WorkflowRun.objects.values_list("pk", flat=True)) == {recent, unfinished.run_id}
    assert set(StepAttempt.objects.values_list("run_id", flat=True)) == {recent}
    assert set(Fact.objects.values_list("run_id", flat=True)) == {recent}
    assert set(OpLedger.objects.values_list("run_id", flat=True)) == {recent, None}
    assert OpLedger.objects.filter(pk=orphan.pk).exists()  # no run: not the prune's to judge

    # Four batches (3 + 3 + 3 + 1), each in a transaction of its own, none deleting more
    # than a batch of runs.
    batches = [
        part
        for part in transactions(captured.captured_queries)
        if any(deletes_from(RUN, sql) for sql in part)
    ]
    assert len(batches) == 4
    per_batch = [
        sum(mentioned(sql, old) for sql in part if deletes_from(RUN, sql)) for part in batches
    ]
    assert per_batch == [3, 3, 3, 1]


def test_prune_with_nothing_to_delete_is_one_short_transaction() -> None:
    tasks_engine.enqueue("noop")
    with CaptureQueriesContext(connection) as captured:
        counts = retention.prune(timedelta(days=0))
    assert counts == counted(runs=0, steps=0, facts=0, ledger=0, outbox_events=0, rate_keys=0)
    assert not any(q["sql"].startswith("DELETE") for q in captured.captured_queries)
    assert WorkflowRun.objects.count() == 1


def test_prune_dispatched_events_in_batches(fake_clock: FakeClock) -> None:
    for i in range(7):
        publish("test.record", {"key": i})
    assert relay_once(10).dispatched == 7
    failing = publish("test.always_fails", {})
    relay_once(10)
    fake_clock.advance(3600)
    fresh = publish("test.record", {"key": "fresh"})
    relay_once(10)

    with CaptureQueriesContext(connection) as captured:
        assert prune_dispatched(clock.now() - timedelta(minutes=30), batch=3) == 7

    assert set(OutboxEvent.objects.values_list("pk", flat=True)) == {failing.pk, fresh.pk}
    deletes = [
        part
        for part in transactions(captured.captured_queries)
        if any(deletes_from(EVENT, sql) for sql in part)
    ]
    assert len(deletes) == 3  # 3 + 3 + 1, each in its own transaction


def test_a_finished_child_stays_while_its_parent_has_not_taken_its_outcome(
    fake_clock: FakeClock,
) -> None:
    # The parent reads the child's row when it resumes: pruning the child first failed the
    # parent with WorkflowRun.DoesNotExist. Found by the schedules/retention audit.
    res = tasks_engine.enqueue("parent", {"value": 4, "sleep": 30})
    drain(fake_clock, pairs=[("parent", 1)])
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    fake_clock.advance(31)
    drain(fake_clock, pairs=[("child_echo", 1)])
    assert WorkflowRun.objects.get(pk=child.pk).status == "completed"
    assert WorkflowRun.objects.get(pk=res.run_id).status == "pending"  # woken, not yet resumed
    fake_clock.advance(3 * 86400)

    assert retention.prune(timedelta(days=1))["runs"] == 0
    assert WorkflowRun.objects.filter(pk=child.pk).exists()

    drain(fake_clock)
    assert tasks_engine.get_run(res.run_id).output == {"child": {"double": 8}}
    fake_clock.advance(3 * 86400)
    assert retention.prune(timedelta(days=1))["runs"] == 2  # both, once the parent is done


def test_a_finished_parent_stays_while_a_child_is_unfinished(fake_clock: FakeClock) -> None:
    # Canceling a parent whose child is running asks the child to stop; the child ends only at
    # its next step. Pruning the canceled parent meanwhile dropped the child's link to it
    # (the run that canceled it). Found by the retention audit.
    res = tasks_engine.enqueue("parent", {"value": 1, "sleep": 30})
    drain(fake_clock, pairs=[("parent", 1)])
    child = WorkflowRun.objects.get(parent_run_id=res.run_id)
    fake_clock.advance(31)
    [held] = transitions.claim_runs("busy-worker", [("child_echo", 1)], None, 1, 3600.0)
    assert held.lease.run_id == child.pk
    assert tasks_engine.cancel(res.run_id)
    assert WorkflowRun.objects.get(pk=res.run_id).status == "canceled"
    assert WorkflowRun.objects.get(pk=child.pk).status == "running"  # asked to stop
    fake_clock.advance(3 * 86400)

    assert retention.prune(timedelta(days=1))["runs"] == 0
    assert WorkflowRun.objects.get(pk=child.pk).parent_run_id == res.run_id
