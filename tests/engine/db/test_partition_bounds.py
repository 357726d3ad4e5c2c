"""Period arithmetic of the partitions (tasks_engine/db/partitions/bounds.py): UTC periods,
their run id bounds, and which period an id falls in."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from tasks_engine import clock
from tasks_engine.db.partitions import bounds
from tests.partitions import v7_at

pytestmark = pytest.mark.one_db("pure arithmetic")


def test_a_month_starts_on_its_first_day_at_utc_midnight_whatever_the_zone() -> None:
    # 1 March 00:30 at UTC+2 is still 28 February in UTC
    at = datetime(2025, 3, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    assert bounds.period_start(at, "month") == datetime(2025, 2, 1, tzinfo=UTC)
    assert bounds.next_start(datetime(2025, 2, 1, tzinfo=UTC), "month") == datetime(
        2025, 3, 1, tzinfo=UTC
    )
    assert bounds.next_start(datetime(2025, 12, 1, tzinfo=UTC), "month") == datetime(
        2026, 1, 1, tzinfo=UTC
    )


def test_a_week_starts_on_monday_and_may_span_two_years() -> None:
    sunday = datetime(2025, 1, 5, 23, 59, 59, 999999, tzinfo=UTC)
    assert bounds.period_start(sunday, "week") == datetime(2024, 12, 30, tzinfo=UTC)
    monday = datetime(2025, 1, 6, tzinfo=UTC)
    assert bounds.period_start(monday, "week") == monday
    assert bounds.next_start(datetime(2024, 12, 30, tzinfo=UTC), "week") == monday


def test_bounds_order_ids_as_postgresql_does_bytewise() -> None:
    start = datetime(2025, 2, 1, tzinfo=UTC)
    end = bounds.next_start(start, "month")
    lo, hi = bounds.id_bound(start), bounds.id_bound(end)
    first_ms, last_ms = v7_at(start), v7_at(end - timedelta(milliseconds=1))
    assert lo.bytes <= first_ms.bytes < hi.bytes
    assert lo.bytes <= last_ms.bytes < hi.bytes
    assert not v7_at(end).bytes < hi.bytes
    assert not v7_at(start - timedelta(milliseconds=1)).bytes >= lo.bytes


def test_an_id_names_its_period_and_a_legacy_id_none() -> None:
    made = clock.new_run_id()
    assert bounds.id_period(made, "month") == bounds.period_start(datetime.now(UTC), "month")
    assert bounds.id_period(v7_at(datetime(2024, 12, 31, 23, 59, tzinfo=UTC)), "week") == (
        datetime(2024, 12, 30, tzinfo=UTC)
    )
    assert bounds.id_period(uuid.uuid4(), "month") is None
    assert bounds.id_period(uuid.UUID("ffffffff-ffff-7fff-bfff-ffffffffffff"), "month") is None


def test_bad_units_and_moments_are_refused() -> None:
    with pytest.raises(ValueError, match="'month' or 'week', not 'day'"):
        bounds.period_start(datetime.now(UTC), "day")
    with pytest.raises(ValueError, match="outside the range"):
        bounds.id_bound(datetime(1969, 12, 31, tzinfo=UTC))


def test_a_period_suffix_is_its_first_day() -> None:
    assert bounds.suffix(datetime(2025, 1, 6, tzinfo=UTC)) == "p20250106"
