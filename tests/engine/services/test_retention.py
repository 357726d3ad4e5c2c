"""The retention service (`retention.prune_expired`, `tasks prune` without --older-than): per
status from TASKS_ENGINE["RETENTION_DAYS"] (None keeps), in batches, plus dispatched outbox
events after OUTBOX["RETENTION_DAYS"]."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import tasks_engine
from outbox import publish
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tasks_engine.checks import check_settings
from tasks_engine.db import partitions
from tasks_engine.models import StepAttempt, WorkflowRun
from tasks_engine.services import retention
from tests.engine.services.test_prune import RUN, attach, deletes_from, transactions
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db

DAY = 86400
ENGINE = {"LEASE_SECONDS": 30}


def finished(fake_clock: FakeClock, n: int = 1) -> dict[str, list[uuid.UUID]]:
    """`n` completed, failed and canceled runs, finished now."""
    runs: dict[str, list[uuid.UUID]] = {"completed": [], "failed": [], "canceled": []}
    for _ in range(n):
        runs["completed"].append(tasks_engine.enqueue("noop").run_id)
        runs["failed"].append(tasks_engine.enqueue("fatal").run_id)
        canceled = tasks_engine.enqueue("noop", available_at=fake_clock.now().replace(year=2099))
        tasks_engine.cancel(canceled.run_id)
        runs["canceled"].append(canceled.run_id)
    drain(fake_clock)
    for status, ids in runs.items():
        assert WorkflowRun.objects.filter(pk__in=ids, status=status).count() == n
    return runs


def left(ids: list[uuid.UUID]) -> int:
    return WorkflowRun.objects.filter(pk__in=ids).count()


@override_settings(
    TASKS_ENGINE={**ENGINE, "RETENTION_DAYS": {"completed": 1, "failed": 5, "canceled": None}}
)
def test_each_status_keeps_its_own_days_and_none_keeps_for_ever(fake_clock: FakeClock) -> None:
    old = finished(fake_clock)
    attach(old["completed"][0], 1)
    fake_clock.advance(2 * DAY)
    recent = finished(fake_clock)
    unfinished = tasks_engine.enqueue("noop", available_at=fake_clock.now().replace(year=2099))
    counts = retention.prune_expired()
    assert counts["runs"] == 1 and counts["facts"] == 1 and counts["ledger"] == 1
    assert left(old["completed"]) == 0  # 2 days > 1
    assert not StepAttempt.objects.filter(run_id__in=old["completed"]).exists()
    assert left(old["failed"]) == 1  # 2 days < 5
    assert left(recent["completed"]) == 1
    fake_clock.advance(4 * DAY)
    counts = retention.prune_expired()
    assert counts["runs"] == 2  # the old failed one (6 days) and the recent completed (4 > 1)
    assert left(old["failed"]) == 0 and left(recent["failed"]) == 1
    fake_clock.advance(3650 * DAY)
    retention.prune_expired()
    assert left(old["canceled"] + recent["canceled"]) == 2  # None: kept for ever
    assert WorkflowRun.objects.filter(pk=unfinished.run_id).exists()


@pytest.mark.skipif(
    partitions.unit() is not None,
    reason="partitioned, runs go with their whole period (test_partition_retention.py); these"
    " runs' ids take the wall clock, their period this month, which the fake clock leaves",
)
def test_the_default_retention_is_30_90_30_days(fake_clock: FakeClock) -> None:
    runs = finished(fake_clock)
    fake_clock.advance(31 * DAY)
    retention.prune_expired()
    assert (left(runs["completed"]), left(runs["failed"]), left(runs["canceled"])) == (0, 1, 0)
    fake_clock.advance(60 * DAY)
    retention.prune_expired()
    assert left(runs["failed"]) == 0


@override_settings(TASKS_ENGINE={**ENGINE, "RETENTION_DAYS": {"completed": 1}})
def test_retention_deletes_in_batches_and_a_round_can_be_capped(fake_clock: FakeClock) -> None:
    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(7)]
    drain(fake_clock)
    fake_clock.advance(2 * DAY)
    assert retention.prune_expired(batch=2, max_batches=2)["runs"] == 4  # two batches of two
    assert left(ids) == 3
    with CaptureQueriesContext(connection) as captured:
        assert retention.prune_expired(batch=2)["runs"] == 3
    batches = [
        part
        for part in transactions(captured.captured_queries)
        if any(deletes_from(RUN, sql) for sql in part)
    ]
    assert len(batches) == 2  # 2 + 1, each its own transaction
    assert left(ids) == 0


@override_settings(OUTBOX={"RETENTION_DAYS": 1})
def test_a_capped_round_caps_dispatched_events_too(fake_clock: FakeClock) -> None:
    # The leader's round is capped so that schedules, dead-worker detection and lease renewal
    # are not held up by a backlog; the outbox's pruner used to delete its whole backlog in
    # one round whatever the cap. Found by the retention audit.
    for i in range(7):
        publish("test.record", {"key": i})
    assert relay_once(10).dispatched == 7
    fake_clock.advance(2 * DAY)
    assert retention.prune_expired(batch=2, max_batches=2)["outbox_events"] == 4
    assert OutboxEvent.objects.count() == 3
    assert retention.prune_expired(batch=2)["outbox_events"] == 3  # uncapped: the rest


@override_settings(OUTBOX={"RETENTION_DAYS": 7})
def test_dispatched_events_go_after_the_outbox_retention(fake_clock: FakeClock) -> None:
    old = publish("test.record", {"key": "old"})
    relay_once(10)
    pending = publish("test.always_fails", {})
    relay_once(10)
    fake_clock.advance(5 * DAY)
    fresh = publish("test.record", {"key": "fresh"})
    relay_once(10)
    fake_clock.advance(3 * DAY)
    assert retention.prune_expired()["outbox_events"] == 1
    remaining = set(OutboxEvent.objects.values_list("pk", flat=True))
    assert old.pk not in remaining and {pending.pk, fresh.pk} <= remaining


@override_settings(OUTBOX={"RETENTION_DAYS": None})
def test_outbox_retention_none_keeps_dispatched_events(fake_clock: FakeClock) -> None:
    publish("test.record", {"key": "kept"})
    relay_once(10)
    fake_clock.advance(3650 * DAY)
    assert retention.prune_expired()["outbox_events"] == 0
    assert OutboxEvent.objects.count() == 1


@override_settings(TASKS_ENGINE={**ENGINE, "RETENTION_DAYS": {"completed": 1, "failed": None}})
def test_tasks_prune_without_older_than_runs_the_retention_service(fake_clock: FakeClock) -> None:
    runs = finished(fake_clock)
    fake_clock.advance(2 * DAY)
    out = StringIO()
    call_command("tasks", "prune", "--json", stdout=out)
    assert json.loads(out.getvalue())["runs"] == 1
    assert (left(runs["completed"]), left(runs["failed"]), left(runs["canceled"])) == (0, 1, 1)
    out = StringIO()
    call_command("tasks", "prune", "--older-than", "1", "--json", stdout=out)  # as before
    assert json.loads(out.getvalue())["runs"] == 2


@pytest.mark.parametrize(
    "days", [{"complete": 1}, [30], {"failed": "soon"}], ids=["unknown", "list", "text"]
)
def test_invalid_retention_days_is_a_check_error(days: object) -> None:
    with override_settings(TASKS_ENGINE={**ENGINE, "RETENTION_DAYS": days}):
        [error] = check_settings()
    assert error.id == "tasks_engine.E001" and "RETENTION_DAYS" in error.msg
