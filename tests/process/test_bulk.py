"""cancel_runs against three real workers claiming and running the runs it cancels."""

from __future__ import annotations

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # row locks (PostgreSQL) against the single writer (SQLite)
]


def test_no_run_completes_a_step_after_its_bulk_cancel_committed(workers) -> None:
    lease = () if connection.vendor == "postgresql" else ("--lease-seconds", "3")
    for tag in ("a", "b", "c"):
        workers("--concurrency", "4", "--poll-interval", "0.1", *lease, tag=tag)
    runs = tasks_engine.enqueue_many(
        "ticker", [{"steps": 30, "seconds": 0.02}] * 40, tags={"race": "1"}
    )
    other = tasks_engine.enqueue_many("ticker", [{"steps": 3, "seconds": 0.01}] * 5)
    ids = [r.run_id for r in runs]
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=ids, status="running").count() >= 6,
        60,
        "the workers to run several of the runs",
    )
    canceled = tasks_engine.cancel_runs(tags={"race": "1"}, reason="race")
    # Every step attempt that had started by now (the cancel has committed) may still end;
    # no other may complete, and none may start.
    started_before = set(StepAttempt.objects.filter(run_id__in=ids).values_list("pk", flat=True))
    wait_for(
        lambda: (
            not WorkflowRun.objects.filter(
                pk__in=ids, status__in=["pending", "running", "waiting"]
            ).exists()
        ),
        60,
        "every run of the filter to end",
    )
    finished = WorkflowRun.objects.filter(pk__in=ids)
    assert canceled == finished.filter(status="canceled").count()
    assert canceled + finished.filter(status="completed").count() == len(ids)
    late = StepAttempt.objects.filter(run_id__in=ids, status="completed").exclude(
        pk__in=started_before
    )
    assert list(late.values_list("run_id", "name")) == []
    for run in finished.filter(status="canceled"):
        assert not StepAttempt.objects.filter(
            run_id=run.pk, started_at__gt=run.cancel_requested_at
        ).exists(), f"a step of {run.pk} started after its cancel"
    assert canceled > 0
    wait_for(
        lambda: all(WorkflowRun.objects.get(pk=r.run_id).status == "completed" for r in other),
        60,
        "the runs outside the filter to complete",
    )
