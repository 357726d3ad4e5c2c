"""The factories (tests/factories.py) build rows the real tables accept, in every status, and
rows the engine's own reads treat as what they claim to be."""

from __future__ import annotations

import pytest

from outbox.models import EventStatus, OutboxEvent
from tasks_engine import get_run
from tasks_engine.models import RunStatus, StepAttempt
from tests.factories import (
    FactFactory,
    OpLedgerFactory,
    OutboxEventFactory,
    StepAttemptFactory,
    WorkflowRunFactory,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("status", RunStatus.values)
def test_a_run_in_every_status_is_stored_and_read_back_by_the_engine(status: str) -> None:
    run = WorkflowRunFactory.create(status=status)
    view = get_run(run.pk)
    assert view is not None and view.status == status
    assert (view.finished_at is not None) is (status in ("completed", "failed", "canceled"))
    assert (run.lease_token is not None) is (status == "running")


def test_steps_facts_and_ledger_rows_belong_to_their_run() -> None:
    run = WorkflowRunFactory.create(status="running")
    StepAttemptFactory.create(run=run, name="submit", seconds=2)
    StepAttemptFactory.create(run=run, name="copy", seconds=None, status="running")
    FactFactory.create(run=run, name="download-done")
    OpLedgerFactory.create(run=run, op_key="qbt:add:1")
    view = get_run(run.pk)
    assert view is not None
    assert [(s.name, s.status, s.finished_at is None) for s in view.steps] == [
        ("submit", "completed", False),
        ("copy", "running", True),
    ]
    assert run.facts.count() == 1 and run.ops.get().op_key == "qbt:add:1"
    assert StepAttempt.objects.filter(run=run).count() == 2


@pytest.mark.parametrize("status", EventStatus.values)
def test_outbox_events_in_every_status_satisfy_the_constraints(status: str) -> None:
    event = OutboxEventFactory.create(status=status)
    stored = OutboxEvent.objects.get(pk=event.pk)
    assert stored.status == status
    assert (stored.published_at is not None) is (status == "dispatched")
