"""Slots: the instants a cron expression names in its timezone, in UTC.

Parsing and the calendar walk are cronsim's, which follows Debian cron across DST changes for
expressions that name a fixed minute and hour: a local time the spring jump skips runs once,
at the jump (02:30 Europe/Berlin on that day is 03:00 CEST, 01:00 UTC), and a local time the
autumn fall-back repeats runs once, the first time (CEST). Expressions with `*` in the minute
or hour fields follow UTC instants (an hourly schedule fires at both 02:00 of the repeated
hour: they are different instants). An optional sixth field, FIRST, gives seconds
("*/5 * * * * *": every five seconds); a six-field expression with a fixed minute and hour
follows the same DST rules at the minute, its seconds counted from there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

# How far back to look for the latest missed slot before walking from the last fired one: a
# frequent schedule finds it in the first window, a yearly one after a few wide ones.
_LOOKBACK = (
    timedelta(minutes=1),
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=32),
    timedelta(days=400),
)
_TICK = timedelta(microseconds=1)


class InvalidSchedule(ValueError):
    """A cron expression or timezone that cannot be used; `what` says which."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what  # "cron" or "timezone"


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    # OSError: a tz database directory ("Europe") or a name too long for a file name, which
    # ZoneInfo reports as IsADirectoryError / OSError rather than ZoneInfoNotFoundError.
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise InvalidSchedule("timezone", f"unknown timezone {name!r}") from None


@dataclass(frozen=True)
class Cron:
    expr: str
    timezone: str
    tz: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tz", zone(self.timezone))
        if not isinstance(self.expr, str) or len(self.expr.split()) not in (5, 6):
            raise InvalidSchedule(
                "cron",
                f"invalid cron expression {self.expr!r}: expected 5 fields "
                "(minute hour day month weekday), or 6 with seconds first",
            )
        try:
            CronSim(self.expr, datetime.now(self.tz))
        except CronSimError as exc:
            raise InvalidSchedule("cron", f"invalid cron expression {self.expr!r}: {exc}") from None

    def slots_after(self, t: datetime) -> Iterator[datetime]:
        """Slots strictly after `t`, in UTC, ascending. Ends when cronsim finds none within
        50 years (an expression such as "0 0 31 2 *" has none)."""
        last = t
        # cronsim walks wall-clock time for fixed-time expressions, so after the repeated
        # hour it can name the first 02:30 again: never go back.
        for slot in self._candidates(t):
            if slot > last:
                last = slot
                yield slot

    def _candidates(self, t: datetime) -> Iterator[datetime]:
        fields = self.expr.split()
        if len(fields) == 5 or fields[1].startswith("*") or fields[2].startswith("*"):
            for local in CronSim(self.expr, t.astimezone(self.tz)):
                yield local.astimezone(UTC)
            return
        # Six fields at a fixed minute and hour: cronsim keeps Debian's DST rules to five-field
        # expressions, so find the minutes with those (the five fields after the seconds) and
        # fire each minute's seconds from there. The minute holding a slot just after `t` may
        # have begun before it: start a minute early.
        seconds = sorted(CronSim(self.expr, t).seconds)
        for local in CronSim(" ".join(fields[1:]), (t - timedelta(minutes=1)).astimezone(self.tz)):
            minute = local.astimezone(UTC)
            for second in seconds:
                yield minute + timedelta(seconds=second)

    def next_after(self, t: datetime) -> datetime | None:
        return next(self.slots_after(t), None)

    def latest_at_or_before(self, now: datetime, *, not_before: datetime) -> datetime:
        """The latest slot in [`not_before`, `now`], `not_before` being a slot <= `now`: after
        downtime the missed slots are not walked one by one unless they are few."""
        for window in (*_LOOKBACK, None):
            start = not_before - _TICK
            if window is not None:
                start = max(start, now - window)
            latest = None
            for slot in self.slots_after(start):
                if slot > now:
                    break
                latest = slot
            if latest is not None:
                return latest
        return not_before


def idempotency_key(name: str, slot: datetime) -> str:
    """`schedule:<name>:<slot>`, the slot in ISO 8601 UTC with an explicit offset:
    schedule:nightly-scan:2026-12-02T02:00:00+00:00."""
    return f"schedule:{name}:{slot.astimezone(UTC).isoformat()}"
