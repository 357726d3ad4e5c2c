"""Run ids are version 7 UUIDs (clock.new_run_id): time-ordered, so that the runs being written
sit together at the right end of the primary key's index; in one process they sort in the
order they were made, within a millisecond too."""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import pytest
from django.db import connection

import tasks_engine
from tasks_engine import clock
from tasks_engine.clock import new_run_id
from tests.factories import WorkflowRunFactory
from tests.helpers import FakeClock


def millis(u: uuid.UUID) -> int:
    return int.from_bytes(u.bytes[:6])


def counter(u: uuid.UUID) -> int:
    return (u.int >> 64 & 0xFFF) << 30 | (u.int >> 32 & 0x3FFF_FFFF)


def test_an_id_is_a_version_7_uuid_of_now() -> None:
    before = time.time_ns() // 1_000_000
    u = new_run_id()
    after = time.time_ns() // 1_000_000
    assert (u.version, u.variant) == (7, uuid.RFC_4122)
    assert before <= millis(u) <= after


def test_ids_sort_in_the_order_made_within_a_millisecond_too() -> None:
    ids = [new_run_id() for _ in range(50_000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    same_ms = [(a, b) for a, b in itertools.pairwise(ids) if millis(a) == millis(b)]
    assert same_ms  # 50,000 ids take more than one per millisecond
    assert all(counter(b) == counter(a) + 1 for a, b in same_ms)
    # the 32 bits after the counter are random: they are not the same across a millisecond
    assert len({b.int & 0xFFFF_FFFF for _, b in same_ms}) > len(same_ms) // 2
    time.sleep(0.002)
    assert new_run_id() > ids[-1]


def test_a_wall_clock_stepping_back_does_not_break_the_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = new_run_id()
    monkeypatch.setattr(clock, "_wall_ns", lambda: time.time_ns() - 3_600_000_000_000)
    later = [new_run_id() for _ in range(100)]
    assert [first, *later] == sorted([first, *later])
    assert {millis(u) for u in later} == {millis(first)}


def test_a_full_counter_moves_on_to_the_next_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    a = new_run_id()
    monkeypatch.setattr(clock, "_wall_ns", lambda: millis(a) * 1_000_000)
    monkeypatch.setattr(clock, "_last_counter", (1 << 42) - 1)
    b = new_run_id()
    assert millis(b) == millis(a) + 1 and b > a and b.version == 7


def test_ids_made_by_threads_at_once_are_distinct() -> None:
    made: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(out: list[uuid.UUID]) -> None:
        out.extend(new_run_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [u for out in made for u in out]
    assert len(set(every)) == 20_000
    assert all(out == sorted(out) for out in made)


@pytest.mark.django_db
def test_enqueue_enqueue_many_and_the_orm_give_version_7_ids_in_creation_order(
    fake_clock: FakeClock,
) -> None:
    fake_clock.advance(86_400)  # the engine's clock is not where ids take their time from
    a = tasks_engine.enqueue("b").run_id
    many = [r.run_id for r in tasks_engine.enqueue_many("b", [{}, {}, {}])]
    orm = WorkflowRunFactory.create().pk  # the model's default
    made = [a, *many, orm]
    assert [u.version for u in made] == [7] * 5
    assert made == sorted(made)
    assert abs(millis(a) - time.time_ns() // 1_000_000) < 60_000
    with connection.cursor() as cur:  # the database orders them as Python does
        cur.execute(
            "SELECT id FROM tasks_engine_workflowrun ORDER BY id",
        )
        assert [uuid.UUID(str(r[0])) for r in cur.fetchall()] == made
