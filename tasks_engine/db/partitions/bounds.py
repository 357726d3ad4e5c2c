"""Time periods as run id ranges. A run id is a version 7 UUID (clock.new_run_id): its first 48
bits are its creation time in Unix milliseconds, and PostgreSQL compares uuids bytewise, so the
ids made in a period are exactly those from the UUID of the period's first millisecond (that
prefix, every other bit zero) up to, not including, the next period's. Periods are UTC: a
month starts on its first day at midnight, a week on Monday at midnight."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

UNITS = ("month", "week")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Python's datetime ends in year 9999; a 48-bit millisecond count reaches year 10889. Ids past
# the last period this can name (and a version 4 id's random prefix often is) have no period.
LAST_START = datetime(9999, 12, 1, tzinfo=UTC)


def period_start(moment: datetime, unit: str) -> datetime:
    """The start of the period (UTC) that holds `moment`."""
    at = moment.astimezone(UTC)
    if unit == "month":
        return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if unit == "week":
        day = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return day - timedelta(days=day.weekday())
    raise ValueError(f"a partition period is 'month' or 'week', not {unit!r}")


def next_start(start: datetime, unit: str) -> datetime:
    """The start of the period after the one that starts at `start`."""
    if unit == "week":
        return start + timedelta(days=7)
    year, month = divmod(start.month, 12)
    return start.replace(year=start.year + year, month=month + 1)


def id_bound(moment: datetime) -> uuid.UUID:
    """The smallest uuid of `moment`'s millisecond: the bound between periods."""
    ms = (moment - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms < 1 << 48:
        raise ValueError(f"{moment} is outside the range of a version 7 uuid")
    return uuid.UUID(int=ms << 80)


def id_moment(run_id: uuid.UUID) -> datetime:
    """The creation time a run id's first 48 bits hold (meaningful for version 7 ids only)."""
    return _EPOCH + timedelta(milliseconds=run_id.int >> 80)


def id_period(run_id: uuid.UUID, unit: str) -> datetime | None:
    """The start of the period whose range holds `run_id`; None for an id no period can name
    (a version 4 id made before migration 0020, or a prefix past year 9999)."""
    if run_id.version != 7 or run_id.int >= id_bound(LAST_START).int:
        return None
    return period_start(id_moment(run_id), unit)


def suffix(start: datetime) -> str:
    """The name of a period's partitions ends in this: p and its first day, p20250106."""
    return "p" + start.strftime("%Y%m%d")
