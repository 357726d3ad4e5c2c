"""TASKS_ENGINE["PARTITION"] on PostgreSQL: migrate converts the run tables into time
partitions (runs by id, steps and facts by run id, one period each), rows and all, once; a
period made later takes its rows out of the DEFAULT partition; the engine runs on them; and the
settings are checked."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.models import Index

import tasks_engine
from tasks_engine.checks import check_settings
from tasks_engine.db.partitions import RUNS, STEPS, bounds, catalog, periods
from tasks_engine.models import Fact, OpLedger, StepAttempt, WorkflowRun
from tasks_engine.services import partitions as partition_upkeep
from tasks_engine.testing import drain
from tests import aliases
from tests.factories import FactFactory, OpLedgerFactory, StepAttemptFactory, WorkflowRunFactory
from tests.partitions import ALIAS, engine_database, partitioned, scalar, v7_at, where

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

RUN, STEP, FACT, LEDGER = (m._meta.db_table for m in (WorkflowRun, StepAttempt, Fact, OpLedger))
JAN, FEB, MAR = (datetime(2025, m, 10, tzinfo=UTC) for m in (1, 2, 3))


@pytest.fixture
def plain() -> Iterator[str]:
    """The engine's tables as migrations make them; PARTITION="month" set but not applied."""
    with engine_database(partition=None), aliases.engine_on(ALIAS, PARTITION="month"):
        yield ALIAS


@pytest.fixture
def engine_part() -> Iterator[str]:
    with engine_database("month"):
        yield ALIAS


def _history() -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for label, moment in (("jan", JAN), ("feb", FEB), ("mar", MAR)):
        runs[label] = WorkflowRunFactory(id=v7_at(moment), status="completed")
        StepAttemptFactory(run=runs[label], name="copy")
        FactFactory(run=runs[label])
    runs["legacy"] = WorkflowRunFactory(id=uuid.uuid4(), status="completed")  # before 0020
    StepAttemptFactory(run=runs["legacy"], name="copy")
    runs["child"] = WorkflowRunFactory(id=v7_at(MAR), parent_run=runs["jan"])
    OpLedgerFactory(run=runs["feb"])
    return runs


def test_migrate_converts_the_run_tables_keeping_every_row_in_its_period(plain: str) -> None:
    runs = _history()
    last_step = StepAttempt.objects.order_by("-id").values_list("id", flat=True)[0]
    converted, _ = partitioned()
    assert converted == [LEDGER, FACT, STEP, RUN]
    assert all(catalog.is_partitioned(t) for t in (RUN, STEP, FACT, LEDGER))
    for label, tag in (("jan", "p20250101"), ("feb", "p20250201"), ("mar", "p20250301")):
        pk = runs[label].pk
        assert where(RUN, "id", pk) == [f"{RUN}_{tag}"]
        assert where(STEP, "run_id", pk) == [f"{STEP}_{tag}"]
        assert where(FACT, "run_id", pk) == [f"{FACT}_{tag}"]
    assert where(RUN, "id", runs["legacy"].pk) == [f"{RUN}_default"]
    assert where(STEP, "run_id", runs["legacy"].pk) == [f"{STEP}_default"]
    assert WorkflowRun.objects.get(pk=runs["child"].pk).parent_run_id == runs["jan"].pk
    assert OpLedger.objects.get().run_id == runs["feb"].pk
    assert where(LEDGER, "run_id", runs["feb"].pk) == [f"{LEDGER}_p20250201"]
    # no foreign key between the run tables is left; the ledger keeps its run index
    assert (
        scalar(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confrelid = %s::regclass",
            [RUN],
        )
        == 0
    )
    # the steps' sequence goes on where the identity stopped
    more: Any = StepAttemptFactory(run=runs["jan"], name="more")
    assert more.pk > last_step
    # the runs' unique keys live on each partition, the children's with their run id on the parent
    for tag in ("default", "p20250101"):
        assert scalar("SELECT to_regclass(%s) IS NOT NULL", [f"run_idempotency_key_unique_{tag}"])
    assert scalar("SELECT to_regclass('step_attempt_unique') IS NOT NULL")
    # the runs' end NOTIFY (migration 0010's trigger) is the parent's, so every partition's
    assert scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname = %s",
        [RUN, "tasks_engine_run_ended"],
    )
    assert partitioned() == ([], [])  # idempotent: nothing left to do


def test_the_step_primary_key_includes_the_run_and_unique_keys_still_refuse(
    engine_part: str,
) -> None:
    run = WorkflowRunFactory(status="running")
    StepAttemptFactory(run=run, name="copy", attempt=1)
    assert "(id, run_id)" in scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
        [f"{STEP}_pkey"],
    )
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        StepAttemptFactory(run=run, name="copy", attempt=1)


def test_a_new_period_takes_its_rows_out_of_the_default_partition(engine_part: str) -> None:
    far = datetime.now(UTC) + timedelta(days=200)  # no partition yet: maintenance fell behind
    run: Any = WorkflowRunFactory(id=v7_at(far), idempotency_key="k1")
    StepAttemptFactory(run=run, name="copy")
    assert where(RUN, "id", run.pk) == [f"{RUN}_default"]
    start = bounds.period_start(far, "month")
    assert periods.create_period(RUNS, start, "month") == f"{RUN}_{bounds.suffix(start)}"
    assert periods.create_period(STEPS, start, "month") is not None
    assert where(RUN, "id", run.pk) == [f"{RUN}_{bounds.suffix(start)}"]
    assert where(STEP, "run_id", run.pk) == [f"{STEP}_{bounds.suffix(start)}"]
    assert scalar(
        "SELECT to_regclass(%s) IS NOT NULL", [f"run_idempotency_key_unique_{bounds.suffix(start)}"]
    )
    assert periods.create_period(RUNS, start, "month") is None  # there already


def test_the_engine_runs_workflows_on_partitioned_tables(engine_part: str) -> None:
    handles = [tasks_engine.enqueue("three_steps", {"n": i}) for i in range(3)]
    keyed = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="once")
    again = tasks_engine.enqueue("noop", {"n": 1}, idempotency_key="once")
    assert again.run_id == keyed.run_id and again.deduplicated
    assert drain()
    for h in [*handles, keyed]:
        assert tasks_engine.get_run(h.run_id).status == "completed"
    now = bounds.suffix(bounds.period_start(datetime.now(UTC), "month"))
    assert set(where(STEP, "run_id", handles[0].run_id)) == {f"{STEP}_{now}"}


def test_migrations_still_apply_to_the_partitioned_tables(engine_part: str) -> None:
    call_command("migrate", database=ALIAS, verbosity=0, interactive=False)  # converts nothing
    index = Index(fields=["queue"], name="run_queue_probe")
    with connections[ALIAS].schema_editor() as editor:
        editor.add_index(WorkflowRun, index)
    assert scalar("SELECT count(*) FROM pg_indexes WHERE indexname LIKE %s", [f"{RUN}_%queue%"])
    with connections[ALIAS].schema_editor() as editor:
        editor.remove_index(WorkflowRun, index)


@pytest.mark.one_db("settings checks")
def test_partition_needs_postgresql_and_a_known_period(tmp_path: Path) -> None:
    with aliases.engine_on("default", PARTITION="month"):
        assert [m.id for m in check_settings()] == []  # a known key: no W003
    with aliases.engine_on("default", PARTITION="day"):
        [error] = check_settings()
        assert error.id == "tasks_engine.E001"
        assert "PARTITION must be 'month', 'week' or None, not 'day'" in error.msg
    with aliases.engine_on("default", PARTITION=3):
        assert [m.id for m in check_settings()] == ["tasks_engine.E001"]
    with (
        aliases.alias("engine_sqlite_part", aliases.sqlite_settings(tmp_path / "p.db")),
        aliases.engine_on("engine_sqlite_part", PARTITION="week"),
    ):
        [error] = check_settings()
        assert error.id == "tasks_engine.E042"
        assert "\n" not in error.msg


def test_tasks_partition_makes_periods_ahead_and_refuses_bad_input(engine_part: str) -> None:
    out = io.StringIO()
    call_command("tasks", "partition", "--ahead", "4", "--json", stdout=out)
    made = json.loads(out.getvalue())
    fourth = bounds.period_start(datetime.now(UTC), "month")
    for _ in range(4):
        fourth = bounds.next_start(fourth, "month")
    assert made["converted"] == []
    assert f"{RUN}_{bounds.suffix(fourth)}" in made["created"]
    with pytest.raises(SystemExit):  # one line on stderr: "must be an integer from 0 to 24"
        call_command("tasks", "partition", "--ahead", "25")
    with aliases.engine_on(ALIAS, PARTITION=None), pytest.raises(CommandError, match="not set"):
        call_command("tasks", "partition")


def test_the_leaders_upkeep_makes_a_missing_period_again(engine_part: str) -> None:
    assert partition_upkeep.run_once() == []  # all there: nothing to do
    following = bounds.next_start(bounds.period_start(datetime.now(UTC), "month"), "month")
    with connections[ALIAS].cursor() as cur:
        periods.detach_and_drop(bounds.suffix(following), cur)
    made = partition_upkeep.run_once()
    assert sorted(made) == sorted(
        f"{t}_{bounds.suffix(following)}" for t in (RUN, STEP, FACT, LEDGER)
    )
