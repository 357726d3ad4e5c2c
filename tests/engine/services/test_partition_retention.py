"""Retention on partitioned tables (TASKS_ENGINE["PARTITION"]): a period whose runs are all
finished and past their status's cutoff, with no unfinished run linked to them elsewhere, goes
whole (detached and dropped, its steps, facts and ledger rows with it); a period
that still holds a waiting run is kept, and its other runs go through the batched DELETE as
they would unpartitioned."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tasks_engine.db.partitions import catalog
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tasks_engine.services import retention
from tests.factories import FactFactory, OpLedgerFactory, StepAttemptFactory, WorkflowRunFactory
from tests.helpers import FakeClock
from tests.partitions import engine_database, make_periods, v7_at

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

RUN = WorkflowRun._meta.db_table
JAN, FEB, MAR, APR = (datetime(2025, m, 10, tzinfo=UTC) for m in (1, 2, 3, 4))


def _run(moment: datetime, status: str = "completed", **more: Any) -> Any:
    run = WorkflowRunFactory(id=v7_at(moment), status=status, now=moment, **more)
    StepAttemptFactory(run=run, name="copy")
    FactFactory(run=run)
    return run


def _history() -> dict[str, Any]:
    """January: a run that waits (for weeks) beside finished ones; February: finished only,
    one of them the parent of a March child; March: a failed run (kept 90 days) and that
    child; April: a run still running."""
    runs = {
        "jan_waiting": _run(JAN, "waiting"),
        "jan_done": _run(JAN),
        "feb_done": _run(FEB),
        "feb_parent": _run(FEB),
        "mar_failed": _run(MAR, "failed"),
        "apr_running": _run(APR, "running"),
    }
    # finished yesterday (a long run): kept, and outlives its parent without the link
    yesterday = datetime(2025, 5, 19, tzinfo=UTC)
    runs["mar_child"] = _run(MAR, parent_run=runs["feb_parent"], finished_at=yesterday)
    OpLedgerFactory(run=runs["feb_done"])
    OpLedgerFactory(run=runs["jan_waiting"], op_key="op:jan")
    return runs


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    from tasks_engine import clock

    fake = FakeClock(datetime(2025, 5, 20, tzinfo=UTC))  # 40+ days after March's runs ended
    monkeypatch.setattr(clock, "now", fake.now)
    return fake


def test_a_period_goes_whole_once_nothing_in_it_is_kept(fake_clock: FakeClock) -> None:
    with engine_database("month"):
        make_periods(JAN, FEB, MAR, APR)
        runs = _history()
        counts = retention.prune_expired()
        # February went whole; January keeps its partition for its waiting run, and its
        # finished run went through the batched path; March's failed run is kept 90 days.
        assert counts["partitions"] == 1
        names = {p.name for p in catalog.partitions(RUN)}
        assert f"{RUN}_p20250201" not in names
        assert {f"{RUN}_p20250101", f"{RUN}_p20250301", f"{RUN}_p20250401"} <= names
        left = set(WorkflowRun.objects.values_list("pk", flat=True))
        assert left == {
            runs[k].pk for k in ("jan_waiting", "mar_failed", "apr_running", "mar_child")
        }
        assert WorkflowRun.objects.get(pk=runs["mar_child"].pk).parent_run_id is None
        assert not StepAttempt.objects.filter(run_id=runs["feb_done"].pk).exists()
        assert not Fact.objects.filter(run_id=runs["feb_done"].pk).exists()
        # February's ledger rows went with its partition, not by a DELETE
        assert list(OpLedger.objects.values_list("op_key", flat=True)) == ["op:jan"]
        ledger = {p.name for p in catalog.partitions(OpLedger._meta.db_table)}
        assert f"{OpLedger._meta.db_table}_p20250201" not in ledger
        assert f"{OpLedger._meta.db_table}_p20250101" in ledger
        assert counts["runs"] == 3  # feb_done, feb_parent (whole), jan_done (batched)

        # the waiting run finishes weeks later; its period goes once it too has aged
        WorkflowRun.objects.filter(pk=runs["jan_waiting"].pk).update(
            status="completed", finished_at=fake_clock.now(), available_at=None
        )
        assert retention.prune_expired()["partitions"] == 0
        fake_clock.advance(timedelta(days=31))
        # January, and March (its failed run now 90 days old, its child's 30 days)
        assert retention.prune_expired()["partitions"] == 2
        names = {p.name for p in catalog.partitions(RUN)}
        assert f"{RUN}_p20250101" not in names and f"{RUN}_p20250301" not in names
        assert f"{RUN}_p20250401" in names  # its run still runs
        assert not WorkflowRun.objects.filter(pk=runs["jan_waiting"].pk).exists()


def test_a_parent_whose_child_is_unfinished_keeps_its_period(fake_clock: FakeClock) -> None:
    with engine_database("month"):
        make_periods(FEB, APR)
        parent = _run(FEB)
        _run(APR, "waiting", parent_run=parent)
        assert retention.prune_expired()["partitions"] == 0
        assert WorkflowRun.objects.filter(pk=parent.pk).exists()  # the batched path's rule too


def test_the_batched_path_prunes_the_same_runs_unpartitioned(fake_clock: FakeClock) -> None:
    with engine_database(partition=None):
        runs = _history()
        counts = retention.prune_expired()
        assert "partitions" not in counts
        left = set(WorkflowRun.objects.values_list("pk", flat=True))
        assert left == {
            runs[k].pk for k in ("jan_waiting", "mar_failed", "apr_running", "mar_child")
        }
        assert counts["runs"] == 3


def test_a_period_not_yet_wholly_past_retention_keeps_its_runs_until_it_goes_whole(
    fake_clock: FakeClock,
) -> None:
    """May 20, completed runs kept 30 days: April's run finished on the 5th is past its
    cutoff, but April is not wholly past it; the service leaves it (no DELETE row by row)
    until the whole of April is, then drops April with one DROP. A run of the DEFAULT
    partition (a version 4 id) has no period to wait for: deleted row by row as before.
    `tasks prune --older-than` asks for rows by age: it deletes April's run at once."""
    with engine_database("month", RETENTION_DAYS={"completed": 30}):
        make_periods(APR)
        april = _run(datetime(2025, 4, 5, tzinfo=UTC))
        WorkflowRunFactory(  # a version 4 id: the DEFAULT partition
            id=uuid.uuid4(), status="completed", now=datetime(2025, 1, 5, tzinfo=UTC)
        )
        counts = retention.prune_expired()
        assert (counts["partitions"], counts["runs"]) == (0, 1)
        assert set(WorkflowRun.objects.values_list("pk", flat=True)) == {april.pk}
        assert StepAttempt.objects.filter(run_id=april.pk).exists()

        fake_clock.advance(timedelta(days=12))  # June 1: April ended more than 30 days ago
        counts = retention.prune_expired()
        assert (counts["partitions"], counts["runs"]) == (1, 1)
        assert f"{RUN}_p20250401" not in {p.name for p in catalog.partitions(RUN)}
        assert not StepAttempt.objects.exists()


def test_prune_older_than_deletes_by_age_inside_a_period(fake_clock: FakeClock) -> None:
    with engine_database("month"):
        make_periods(APR)
        april = _run(datetime(2025, 4, 5, tzinfo=UTC))
        counts = retention.prune(timedelta(days=30))
        assert (counts["partitions"], counts["runs"]) == (0, 1)
        assert not WorkflowRun.objects.filter(pk=april.pk).exists()
