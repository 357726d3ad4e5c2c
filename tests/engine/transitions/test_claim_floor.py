"""Claims on partitioned tables never read old periods: the sources of every claim (plain,
guarded, rate-keyed) carry the claim floor (transitions/claim_floor.py), the start of the
oldest period holding an unfinished run, and PostgreSQL leaves the older partitions out of the
plan (EXPLAIN ANALYZE on real rows in several periods). A run made claimable again below the
floor is still claimed: at once in the process that retried it, within REFRESH_SECONDS in any
other."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections

import tasks_engine
from tasks_engine import clock, transitions
from tasks_engine.db import sql as sql_module
from tasks_engine.db.alias import atomic
from tasks_engine.models import WorkflowRun
from tasks_engine.transitions import (
    claim_floor,
    claim_mode,
    claims,
    flow_claims_pg,
    flow_rate_claims,
)
from tests.engine.transitions.test_flow_control import FLOW, limit_queues
from tests.factories import WorkflowRunFactory
from tests.partitions import ALIAS, engine_database, finished_runs, make_periods, v7_at

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

RUN = WorkflowRun._meta.db_table
JAN, FEB, MAR = (datetime(2025, m, 10, tzinfo=UTC) for m in (1, 2, 3))
OLD = ("p20250101", "p20250201", "p20250301")
PAIRS = [("noop", 1)]
PER_PERIOD = 300


@pytest.fixture
def history() -> Iterator[str]:
    """Finished runs in three old periods, and one pending run now."""
    with engine_database("month"):
        make_periods(JAN, FEB, MAR)
        rows = [r for moment in (JAN, FEB, MAR) for r in finished_runs(moment, PER_PERIOD)]
        WorkflowRun.objects.bulk_create(rows)
        with connections[ALIAS].cursor() as cur:
            cur.execute(f"ANALYZE {RUN}")
        yield ALIAS


def _plan() -> str:
    """EXPLAIN ANALYZE of the plain claim (rolled back)."""
    req = claims.ClaimRequest("w", PAIRS, None, 10, 600.0)
    sql, params = claims.claim_sql(req, clock.now())
    with atomic(), connections[ALIAS].cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
        transaction_rollback()
    return plan


def transaction_rollback() -> None:
    from django.db import transaction

    transaction.set_rollback(True, using=ALIAS)


def _read(plan: str, tag: str) -> list[str]:
    """The plan's lines that read the period `tag` (and were executed)."""
    return [
        line for line in plan.splitlines() if f"_{tag}" in line and "never executed" not in line
    ]


def _claim() -> list[Any]:
    return [c.run.pk for c in transitions.claim_runs("w", PAIRS, None, 10, 600.0)]


def test_the_claim_reads_no_period_below_the_oldest_unfinished_run(history: str) -> None:
    fresh = tasks_engine.enqueue("noop", {"n": 1}).run_id
    plan = _plan()
    assert "tasks_engine_workflowrun_default" in plan  # the DEFAULT partition is always read
    for tag in OLD:
        assert _read(plan, tag) == [], plan
    # a run of February waits with a due timer: February is read again, January still not
    woken: Any = WorkflowRunFactory(
        id=v7_at(FEB), status="waiting", available_at=clock.now() - timedelta(seconds=1)
    )
    claim_floor.forget()
    plan = _plan()
    assert _read(plan, "p20250101") == [], plan
    assert _read(plan, "p20250201") != [], plan
    assert set(_claim()) == {fresh, woken.pk}


def test_a_retry_below_the_floor_is_claimed_at_once_here(history: str) -> None:
    old = WorkflowRun.objects.filter(created_at=JAN).order_by("id").first()
    WorkflowRun.objects.filter(pk=old.pk).update(status="failed")
    assert _claim() == []  # the floor is computed (above January)
    assert tasks_engine.retry_run(old.pk, reason="again")
    assert _claim() == [old.pk]


def test_a_retry_in_another_process_is_claimed_within_the_refresh(
    history: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = WorkflowRun.objects.filter(created_at=JAN).order_by("id").first()
    assert _claim() == []
    # as another process's retry: the row changes, this process's floor does not
    WorkflowRun.objects.filter(pk=old.pk).update(status="pending", available_at=clock.now())
    assert _claim() == []  # late ...
    later = claim_floor._monotonic() + claim_floor.REFRESH_SECONDS
    monkeypatch.setattr(claim_floor, "_monotonic", lambda: later)
    assert _claim() == [old.pk]  # ... by at most REFRESH_SECONDS, never lost


def _explain(statements: list[tuple[str, Any]], before: tuple[str, Any] | None = None) -> str:
    """EXPLAIN ANALYZE of these statements, in order, in one transaction rolled back."""
    plans = []
    with atomic(), connections[ALIAS].cursor() as cur:
        if before is not None:
            cur.execute(*before)
        for sql, params in statements:
            cur.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, params)
            plans.append("\n".join(row[0] for row in cur.fetchall()))
        transaction_rollback()
    return "\n".join(plans)


def test_the_guarded_claim_reads_no_period_below_the_floor(history: str, settings: Any) -> None:
    limit_queues(settings, {"default": {"concurrency": 5}})
    keyed = tasks_engine.enqueue("flow-disk", {"disk": "a"}).run_id
    req = claims.ClaimRequest("w", FLOW, None, 10, 600.0)
    limited = claim_mode.limited_queues(None)
    first, p1, second, p2 = flow_claims_pg.statements(req, limited, clock.now())
    assert flow_claims_pg.FLOOR_SETTING in first and flow_claims_pg.FLOOR_SETTING in second
    settings_sql, floor = flow_claims_pg.planner_settings()
    assert settings_sql == flow_claims_pg.PLANNED_FLOOR
    plan = _explain([(first, p1), (second, p2)], before=(settings_sql, floor))
    assert "tasks_engine_workflowrun_default" in plan
    for tag in OLD:
        # the update of a prepared (generic) plan names every partition as a target; their
        # scans are removed when it starts ("Subplans Removed")
        assert [line for line in _read(plan, tag) if "Update on" not in line] == [], plan
    claim_mode.note_keyed()
    try:
        assert [c.run.pk for c in transitions.claim_runs("w", FLOW, None, 10, 600.0)] == [keyed]
    finally:
        claim_mode.forget_keyed()


def test_the_rate_claim_reads_no_period_below_the_floor(
    history: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit_queues(settings, {"default": {"concurrency": 5}})
    rated = tasks_engine.enqueue("flow-key-rate", {"disk": "a"}).run_id
    req = claims.ClaimRequest("w", [("flow-key-rate", 1)], None, 10, 600.0)
    reads: list[tuple[str, Any]] = []

    pg = sql_module._pg

    def record(sql: str, params: Any, *, fetch: bool) -> Any:
        if sql.startswith(("SELECT id,", "SELECT COUNT(*)", "UPDATE")) and RUN in sql:
            reads.append((sql, params))
        return pg(sql, params, fetch=fetch)

    monkeypatch.setattr(sql_module, "_pg", record)  # the engine's statements on PostgreSQL
    assert [c.run.pk for c in flow_rate_claims.claim_rate_keyed(req)] == [rated]
    monkeypatch.undo()
    # due timers, pending runs, the queue's running runs, the update
    assert len(reads) == 4, reads
    assert all("id >= " in sql for sql, _ in reads), reads
    plan = _explain(reads)
    assert "tasks_engine_workflowrun_default" in plan
    for tag in OLD:
        assert _read(plan, tag) == [], plan
