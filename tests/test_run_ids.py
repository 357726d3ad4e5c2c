"""Run ids are version 7 UUIDs (tasks_engine/run_ids.py): time-ordered, so that the runs
being written sit together at the right end of the primary key's index."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.run_ids import new_run_id
from tests.factories import WorkflowRunFactory
from tests.helpers import FakeClock


def millis(u: uuid.UUID) -> int:
    return int.from_bytes(u.bytes[:6])


def test_an_id_is_a_version_7_uuid_of_now() -> None:
    before = time.time_ns() // 1_000_000
    u = new_run_id()
    after = time.time_ns() // 1_000_000
    assert (u.version, u.variant) == (7, uuid.RFC_4122)
    assert before <= millis(u) <= after


def test_ids_of_a_later_millisecond_sort_after_and_ids_do_not_repeat() -> None:
    first = [new_run_id() for _ in range(50_000)]
    time.sleep(0.002)
    later = new_run_id()
    assert all(later > u for u in first)
    assert len(set(first)) == len(first)
    # 74 random bits: the ids of one millisecond differ in more than their time
    assert len({u.int & ((1 << 74) - 1) for u in first}) == len(first)


@pytest.mark.django_db
def test_enqueue_and_the_orm_give_runs_version_7_ids_in_creation_order(
    fake_clock: FakeClock,
) -> None:
    fake_clock.advance(86_400)  # the engine's clock is not where ids take their time from
    a = tasks_engine.enqueue("b").run_id
    time.sleep(0.002)
    b = tasks_engine.enqueue("b").run_id
    orm = WorkflowRunFactory.create()  # the model's default
    assert [u.version for u in (a, b, orm.pk)] == [7, 7, 7]
    assert a < b < orm.pk
    with connection.cursor() as cur:  # the database orders them as Python does
        cur.execute(
            "SELECT id FROM tasks_engine_workflowrun WHERE id IN (%s, %s, %s) ORDER BY id",
            [a, b, orm.pk] if connection.vendor == "postgresql" else [a.hex, b.hex, orm.pk.hex],
        )
        assert [uuid.UUID(str(r[0])) for r in cur.fetchall()] == [a, b, orm.pk]
