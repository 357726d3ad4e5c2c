"""The runs' unique keys on partitioned tables (TASKS_ENGINE["PARTITION"]): a partition's unique
index sees its own period only, so two enqueues of one key whose ids fall in two periods (made
on each side of a month's end) would both insert. creating.py locks the keys and looks across
every partition first: exactly one run holds a key, whatever periods the racers' ids are in."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tasks_engine.db.partitions import bounds
from tasks_engine.models import WorkflowRun
from tasks_engine.transitions import creating, enqueueing
from tasks_engine.transitions.creating import NewRun
from tests.engine.transitions.test_flow_race import in_threads
from tests.partitions import engine_database, v7_at, where

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only("partitions")]

RUN = WorkflowRun._meta.db_table
ROUNDS = 12


@pytest.fixture
def engine_part() -> Iterator[str]:
    with engine_database("month") as alias:
        yield alias


def _run(run_id: object, **keys: str) -> NewRun:
    window = {"debounce": timedelta(seconds=30)} if "debounce_key" in keys else {}
    return NewRun(
        task_name="noop",
        version=1,
        queue="default",
        priority=0,
        input={"n": 1},
        input_hash="h",
        trace_id="",
        id=run_id,  # type: ignore[arg-type]
        **keys,  # type: ignore[arg-type]
        **window,  # type: ignore[arg-type]
    )


def _boundary() -> datetime:
    """The end of the current month: its partition and the next one both exist."""
    return bounds.next_start(bounds.period_start(datetime.now(UTC), "month"), "month")


@pytest.mark.parametrize("kind", ["idempotency_key", "queueing_key", "debounce_key"])
def test_racers_across_a_period_boundary_make_exactly_one_run(engine_part: str, kind: str) -> None:
    edge = _boundary()
    for i in range(ROUNDS):
        key = f"{kind}-{i}"
        # one id just before the month's end, one just after: two partitions
        ids = [v7_at(edge - timedelta(milliseconds=1)), v7_at(edge)]
        barrier = threading.Barrier(2, timeout=10)
        answers: list[tuple[object, bool]] = [None, None]  # type: ignore[list-item]

        def enqueue(n: int, ids: list[Any] = ids, key: str = key, barrier: Any = barrier) -> None:
            barrier.wait()
            [answers[n]] = enqueueing.answer("noop", [_run(ids[n], **{kind: key})])  # noqa: B023

        assert in_threads(enqueue, 2, timeout=30) == []
        holders = list(WorkflowRun.objects.filter(**{kind: key}).values_list("pk", flat=True))
        assert len(holders) == 1, f"round {i}: {holders}"
        assert sorted(d for _, d in answers) == [False, True]
        assert {r for r, _ in answers} == set(holders)
    later = WorkflowRun.objects.filter(**{f"{kind}__isnull": False}).values_list("pk", flat=True)
    assert {where(RUN, "id", pk)[0].rsplit("_", 1)[1] for pk in later} <= {
        bounds.suffix(bounds.period_start(edge - timedelta(days=1), "month")),
        bounds.suffix(edge),
    }


def test_the_key_locks_sort_and_name_each_key_once() -> None:
    runs = [
        _run(v7_at(datetime.now(UTC)), idempotency_key="a", queueing_key="q"),
        _run(v7_at(datetime.now(UTC)), idempotency_key="a"),
    ]
    names = creating.run_key_locks(runs)
    assert names == sorted(names) and len(names) == 2
