"""The op ledger on partitioned tables (TASKS_ENGINE["PARTITION"]): its rows live in their run's
period, by run id; a row whose run was deleted by hand (SET NULL) in the DEFAULT partition. An
op key stays unique across every run although each partition's unique index sees its own
period: fencing.py locks the key before it looks, so two runs of two periods entering one op
at the same instant make one started row (without the lock, both insert)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tasks_engine import transitions
from tasks_engine.db.partitions import bounds
from tasks_engine.models import OpLedger, WorkflowRun
from tasks_engine.runtime import fencing
from tests.engine.transitions.test_flow_race import in_threads
from tests.factories import OpLedgerFactory, WorkflowRunFactory
from tests.partitions import engine_database, scalar, v7_at, where

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

LEDGER = OpLedger._meta.db_table
ROUNDS = 12


@pytest.fixture
def engine_part() -> Iterator[str]:
    with engine_database("month") as alias:
        yield alias


def _boundary() -> datetime:
    """The end of the current month: its partition and the next one both exist."""
    return bounds.next_start(bounds.period_start(datetime.now(UTC), "month"), "month")


def _lease(moment: datetime) -> transitions.Lease:
    run: Any = WorkflowRunFactory(id=v7_at(moment), status="running")
    return transitions.Lease(run.pk, run.lease_token, run.worker_id)


def test_ledger_rows_live_in_their_runs_period_and_orphans_in_default(engine_part: str) -> None:
    edge = _boundary()
    before, after = _lease(edge - timedelta(milliseconds=1)), _lease(edge)
    assert fencing._record_start(before, "op-a") is False
    assert fencing._record_start(after, "op-b") is False
    this_month = bounds.suffix(bounds.period_start(edge - timedelta(days=1), "month"))
    assert where(LEDGER, "op_key", "op-a") == [f"{LEDGER}_{this_month}"]
    assert where(LEDGER, "op_key", "op-b") == [f"{LEDGER}_{bounds.suffix(edge)}"]
    # the next month's run takes op-a over once this month's attempt is gone: the row moves
    WorkflowRun.objects.filter(pk=before.run_id).update(status="pending", lease_token=None)
    assert fencing._record_start(after, "op-a") is True  # resumed
    assert where(LEDGER, "op_key", "op-a") == [f"{LEDGER}_{bounds.suffix(edge)}"]
    fencing._store_result(after, "op-a", {"ok": 1})
    assert OpLedger.objects.get(op_key="op-a").status == "done"
    # a run deleted by hand: its rows outlive it, run id NULL, in the DEFAULT partition
    orphan: Any = OpLedgerFactory()
    WorkflowRun.objects.filter(pk=orphan.run_id).delete()
    assert where(LEDGER, "op_key", orphan.op_key) == [f"{LEDGER}_default"]
    assert OpLedger.objects.get(op_key=orphan.op_key).run_id is None
    # the primary key became a unique index with the run id (a NULL run id is allowed)
    assert scalar("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass", [LEDGER]) == 0
    assert "(id, run_id)" in scalar("SELECT pg_get_indexdef(%s::regclass)", [f"{LEDGER}_pkey"])


def test_two_runs_of_two_periods_entering_one_op_make_one_started_row(engine_part: str) -> None:
    edge = _boundary()
    for i in range(ROUNDS):
        key = f"download:{i}"
        # one run just before the month's end, one just after: two ledger partitions
        leases = [_lease(edge - timedelta(milliseconds=1)), _lease(edge)]
        barrier = threading.Barrier(2, timeout=10)
        answers: list[object] = [None, None]

        def enter(
            n: int,
            leases: Any = leases,
            key: str = key,
            barrier: Any = barrier,
            answers: Any = answers,
        ) -> None:
            barrier.wait()
            answers[n] = fencing._record_start(leases[n], key)

        assert in_threads(enter, 2, timeout=30) == []
        rows = list(OpLedger.objects.filter(op_key=key).values_list("run_id", "status"))
        assert len(rows) == 1, f"round {i}: {rows}"
        [(holder, status)] = rows
        assert status == "started"
        # the other run saw the op in progress in the holder's live attempt
        assert sorted(type(a).__name__ for a in answers) == ["_Busy", "bool"], answers
        assert answers[[lease.run_id for lease in leases].index(holder)] is False
