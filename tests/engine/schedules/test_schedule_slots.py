"""Slot arithmetic (tasks_engine/schedules/slots.py): DST in Europe/Berlin, seconds, catch-up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tasks_engine.schedules import Cron, InvalidSchedule, idempotency_key

pytestmark = pytest.mark.one_db("slot arithmetic")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def slots(cron: Cron, after: datetime, n: int) -> list[str]:
    it = cron.slots_after(after)
    return [next(it).isoformat() for _ in range(n)]


def brute_latest(cron: Cron, now: datetime, not_before: datetime) -> datetime:
    """The latest slot <= now, walking every slot from not_before."""
    latest = not_before
    for slot in cron.slots_after(not_before):
        if slot > now:
            return latest
        latest = slot
    return latest


def test_daily_in_berlin_is_utc_shifted_by_the_season() -> None:
    cron = Cron("0 3 * * *", "Europe/Berlin")
    assert cron.next_after(utc(2026, 12, 1, 12)) == utc(2026, 12, 2, 2)  # CET, UTC+1
    assert cron.next_after(utc(2026, 7, 1, 12)) == utc(2026, 7, 2, 1)  # CEST, UTC+2


def test_a_time_the_spring_jump_skips_fires_once_at_the_jump() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    cron = Cron("30 2 * * *", "Europe/Berlin")
    assert slots(cron, utc(2026, 3, 27, 12), 3) == [
        "2026-03-28T01:30:00+00:00",  # 02:30 CET
        "2026-03-29T01:00:00+00:00",  # 03:00 CEST, the jump: once
        "2026-03-30T00:30:00+00:00",  # 02:30 CEST
    ]


def test_a_time_the_autumn_repeats_fires_once() -> None:
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice, fires the first time.
    cron = Cron("30 2 * * *", "Europe/Berlin")
    assert slots(cron, utc(2026, 10, 23, 12), 3) == [
        "2026-10-24T00:30:00+00:00",
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST; 02:30 CET (01:30 UTC) does not fire
        "2026-10-26T01:30:00+00:00",
    ]


def test_inside_the_repeated_hour_the_next_slot_never_goes_back() -> None:
    """At 02:00 CET (after the first 02:30 CEST fired) cronsim's wall-clock walk names 02:30
    again; that instant is in the past, and the second 02:30 must not fire either."""
    cron = Cron("30 2 * * *", "Europe/Berlin")
    for after in (utc(2026, 10, 25, 0, 31), utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 1, 30)):
        assert cron.next_after(after) == utc(2026, 10, 26, 1, 30)


def test_an_hourly_schedule_fires_each_instant_of_the_repeated_hour() -> None:
    cron = Cron("0 * * * *", "Europe/Berlin")
    assert slots(cron, utc(2026, 10, 24, 23, 30), 3) == [
        "2026-10-25T00:00:00+00:00",  # 02:00 CEST
        "2026-10-25T01:00:00+00:00",  # 02:00 CET: another hour
        "2026-10-25T02:00:00+00:00",
    ]


def test_seconds_come_first_in_a_six_field_expression() -> None:
    cron = Cron("*/20 * * * * *", "UTC")
    assert slots(cron, utc(2026, 1, 1, 0, 0, 5), 3) == [
        "2026-01-01T00:00:20+00:00",
        "2026-01-01T00:00:40+00:00",
        "2026-01-01T00:01:00+00:00",
    ]


def test_slots_are_strictly_after_the_given_instant() -> None:
    cron = Cron("0 3 * * *", "UTC")
    assert cron.next_after(utc(2026, 1, 1, 3)) == utc(2026, 1, 2, 3)
    assert cron.next_after(utc(2026, 1, 1, 3) - timedelta(microseconds=1)) == utc(2026, 1, 1, 3)


def test_an_expression_with_no_slot_has_no_next() -> None:
    # day 1 or 30 of February, and its fifth Monday (only ever the 29th): never
    assert Cron("0 0 */29 2 MON#5", "UTC").next_after(utc(2026, 1, 1)) is None


@pytest.mark.parametrize(
    ("expr", "tz", "downtime"),
    [
        ("0 3 * * *", "Europe/Berlin", timedelta(days=10)),
        ("30 2 * * *", "Europe/Berlin", timedelta(days=400)),  # across both DST changes
        ("* * * * * *", "UTC", timedelta(hours=5)),
        ("*/7 * * * *", "America/New_York", timedelta(days=3)),
        ("0 0 1 1 *", "UTC", timedelta(days=800)),  # yearly: past every lookback window
        ("15 10 29 2 *", "Asia/Tokyo", timedelta(days=3000)),  # leap days only
        ("*/20 30 2 * * *", "Europe/Berlin", timedelta(days=400)),  # six fields, fixed time
    ],
)
def test_latest_missed_slot_matches_walking_every_slot(
    expr: str, tz: str, downtime: timedelta
) -> None:
    cron = Cron(expr, tz)
    for start in (utc(2026, 3, 28, 23, 59, 59), utc(2026, 10, 24, 23, 17, 3)):
        first = cron.next_after(start)
        assert first is not None
        now = first + downtime
        assert cron.latest_at_or_before(now, not_before=first) == brute_latest(cron, now, first)


def test_latest_slot_is_not_before_when_nothing_later_passed() -> None:
    cron = Cron("0 3 * * *", "UTC")
    slot = utc(2026, 1, 1, 3)
    assert cron.latest_at_or_before(slot, not_before=slot) == slot
    assert cron.latest_at_or_before(slot + timedelta(hours=23), not_before=slot) == slot


def test_idempotency_key_is_iso_8601_utc_with_offset() -> None:
    berlin = datetime(2026, 12, 2, 3, tzinfo=Cron("0 3 * * *", "Europe/Berlin").tz)
    assert (
        idempotency_key("nightly-scan", berlin) == "schedule:nightly-scan:2026-12-02T02:00:00+00:00"
    )


@pytest.mark.parametrize(
    ("expr", "tz", "what"),
    [
        ("61 * * * *", "UTC", "cron"),
        ("* * *", "UTC", "cron"),
        ("0 0 31 2 *", "UTC", "cron"),  # cronsim: no month has that day
        ("every day", "UTC", "cron"),
        ("0 3 * * *", "Europe/Nowhere", "timezone"),
        ("0 3 * * *", "../etc/passwd", "timezone"),
        ("0 3 * * *", "", "timezone"),
    ],
)
def test_invalid_expressions_and_zones_are_refused(expr: str, tz: str, what: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        Cron(expr, tz)
    assert info.value.what == what


def test_a_six_field_expression_at_a_fixed_time_follows_the_same_dst_rules() -> None:
    # cronsim applies Debian's DST rules to five-field expressions only: "0 30 2 * * *" fired
    # twice on the autumn day and not at all on the spring day, unlike the documented rules
    # for expressions with a fixed minute and hour. Found by the schedules audit.
    cron = Cron("15 30 2 * * *", "Europe/Berlin")
    assert slots(cron, utc(2026, 3, 28, 12), 2) == [
        "2026-03-29T01:00:15+00:00",  # 03:00:15 CEST, the jump: once
        "2026-03-30T00:30:15+00:00",
    ]
    assert slots(cron, utc(2026, 10, 24, 12), 2) == [
        "2026-10-25T00:30:15+00:00",  # 02:30:15 CEST; not again at 02:30:15 CET
        "2026-10-26T01:30:15+00:00",
    ]
    every_20s = Cron("*/20 30 2 * * *", "Europe/Berlin")
    assert slots(every_20s, utc(2026, 10, 25, 0, 30, 5), 3) == [
        "2026-10-25T00:30:20+00:00",
        "2026-10-25T00:30:40+00:00",
        "2026-10-26T01:30:00+00:00",
    ]
    # With `*` in the hour it follows real time, as a five-field one does.
    hourly = Cron("0 0 * * * *", "Europe/Berlin")
    assert slots(hourly, utc(2026, 10, 24, 23, 30), 3) == [
        "2026-10-25T00:00:00+00:00",
        "2026-10-25T01:00:00+00:00",
        "2026-10-25T02:00:00+00:00",
    ]
