"""The cursors a PostgreSQL connection keeps for the engine's statements (sql.statement_cursor):
one per statement text, reused with its adapters, bounded, and never carried over to another
connection; values of any type still reach the database as given."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, OperationalError, connection, transaction

import tasks_engine
from tasks_engine import clock
from tasks_engine.db import sql
from tasks_engine.models import WorkflowRun
from tests.helpers import database_url


@pytest.fixture
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs the engine's statements on Django's cursors")


def kept() -> dict[str, tuple[str, Any]]:
    cursors: dict[str, tuple[str, Any]] = connection.connection._engine_cursors
    return cursors


@pytest.mark.django_db
def test_a_statement_runs_again_on_its_cursor_with_the_same_adapters(postgres_only: None) -> None:
    tasks_engine.enqueue("bench_noop")
    # the connection may keep other INSERTs from earlier tests: take the one enqueue just ran,
    # the most recently used statement that writes a run
    [(text, cur), *_] = [
        entry
        for entry in reversed(kept().values())
        if "INSERT INTO" in entry[0] and "tasks_engine_workflowrun" in entry[0]
    ]
    adapters = cur._tx
    tasks_engine.enqueue("bench_noop")
    assert kept()[text][1] is cur
    assert cur._tx is adapters  # psycopg kept them: the same statement object ran again


@pytest.mark.django_db
def test_a_parameter_whose_type_changes_between_calls_is_written_as_given(
    postgres_only: None,
) -> None:
    due = clock.now() + timedelta(hours=1)
    plain = tasks_engine.enqueue("bench_noop").run_id
    timed = tasks_engine.enqueue(
        "bench_noop", deadline_at=due, trace_id="t" * 32, parent_run_id=plain
    ).run_id
    again = tasks_engine.enqueue("bench_noop").run_id
    rows = {r.pk: r for r in WorkflowRun.objects.filter(pk__in=[plain, timed, again])}
    assert [rows[plain].deadline_at, rows[again].deadline_at] == [None, None]
    assert [rows[plain].parent_run_id, rows[again].parent_run_id] == [None, None]
    assert (rows[timed].deadline_at, rows[timed].trace_id) == (due, "t" * 32)
    assert rows[timed].parent_run_id == plain


@pytest.mark.django_db
def test_a_statement_the_database_refused_runs_again_on_its_cursor(postgres_only: None) -> None:
    statement = "SELECT 10 / %s::int"
    with pytest.raises(DataError), transaction.atomic():
        sql.fetchall(statement, [0])
    cur = kept()[statement][1]
    assert sql.fetchall(statement, [5]) == [(2,)]
    assert kept()[statement][1] is cur


@pytest.mark.django_db
def test_a_connection_keeps_a_bounded_number_of_cursors(postgres_only: None) -> None:
    for i in range(sql.KEPT_CURSORS + 6):
        assert sql.fetchall(f"SELECT %s::int + {i}", [1]) == [(1 + i,)]
    cursors = kept()
    assert len(cursors) == sql.KEPT_CURSORS
    assert "SELECT %s::int + 0" not in cursors  # the least recently used went first
    assert f"SELECT %s::int + {sql.KEPT_CURSORS + 5}" in cursors


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_cursors_of_its_own(postgres_only: None) -> None:
    statement = "SELECT %s::text"
    assert sql.fetchall(statement, ["a"]) == [("a",)]
    old = kept()[statement][1]
    connection.close()
    assert sql.fetchall(statement, ["b"]) == [("b",)]
    new = kept()[statement][1]
    assert new is not old and new.connection is connection.connection
    assert old.connection.closed


@pytest.mark.django_db(transaction=True)
def test_a_guarded_claim_that_failed_in_its_pipeline_claims_on_the_same_cursors(
    postgres_only: None, settings: Any
) -> None:
    """The guarded claim sends three statements in one pipeline on kept cursors: a failure in
    the middle one (the queue's lock held elsewhere past lock_timeout) leaves the connection
    usable, claims nothing, and the next claim runs on the same cursors and takes the run."""
    import psycopg

    from tasks_engine import transitions
    from tasks_engine.transitions import claim_mode
    from tasks_engine.transitions.flow_claims_pg import QUEUE_LOCK

    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "QUEUES": {"flow-io": {"concurrency": 1}}}
    run_id = tasks_engine.enqueue("flow-plain", {}).run_id
    pairs = [("flow-plain", 1)]
    try:
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s, hashtext('flow-io'))", [QUEUE_LOCK])
            with connection.cursor() as cur:
                cur.execute("SET lock_timeout = '50ms'")
            with pytest.raises(OperationalError, match="lock timeout"):
                transitions.claim_runs("w", pairs, None, 1, 600.0)
            before = {text: cur for text, (_, cur) in kept().items()}
            other.execute("SELECT pg_advisory_unlock(%s, hashtext('flow-io'))", [QUEUE_LOCK])
        [got] = transitions.claim_runs("w", pairs, None, 1, 600.0)
        assert got.run.pk == run_id
        reused = [text for text, (_, cur) in kept().items() if before.get(text) is cur]
        assert len(reused) >= 3  # PLANNED and the two claim statements: the cursors that failed
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")
        claim_mode.forget_keyed()
