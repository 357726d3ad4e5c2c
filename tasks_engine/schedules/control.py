"""Operating schedules: list them with their state, pause and resume them (CLI and admin)."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from .. import clock
from ..db.alias import atomic
from ..exceptions import UnknownScheduleError
from ..models import Schedule
from .firing import new_row, next_fire, state_row
from .specs import ScheduleSpec, defined


@dataclass(frozen=True)
class ScheduleView:
    name: str
    task: str
    cron: str
    timezone: str
    paused: bool
    next_fire_at: datetime | None
    last_slot_at: datetime | None
    last_fired_at: datetime | None
    last_run_id: uuid.UUID | None
    last_error: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: UUIDs and times as strings."""
        return {
            k: (
                str(v)
                if isinstance(v, uuid.UUID)
                else v.isoformat()
                if isinstance(v, datetime)
                else v
            )
            for k, v in asdict(self).items()
        }


def list_schedules() -> list[ScheduleView]:
    """Every defined schedule, by name, with the slot that fires next (`firing.next_fire`):
    after downtime the latest missed slot, which the leader fires as soon as it runs."""
    now = clock.now()
    rows = {row.name: row for row in Schedule.objects.all()}
    views = []
    for name, spec in sorted(defined().items()):
        row = rows.get(name)
        views.append(
            ScheduleView(
                name=name,
                task=spec.task,
                cron=spec.cron.expr,
                timezone=spec.cron.timezone,
                paused=bool(row and row.paused),
                next_fire_at=next_fire(spec, row, now),
                last_slot_at=row.last_slot_at if row else None,
                last_fired_at=row.last_fired_at if row else None,
                last_run_id=row.last_run_id if row else None,
                last_error=row.last_error if row else "",
            )
        )
    return views


def spec_of(name: str) -> ScheduleSpec:
    spec = defined().get(name)
    if spec is None:
        raise UnknownScheduleError(f"unknown schedule {name!r}")
    return spec


def pause(name: str) -> bool:
    """Stop firing `name` until resumed (slots in between are not fired later). False when it
    was already paused. Raises UnknownScheduleError for a name no schedule has."""
    spec = spec_of(name)
    now = clock.now()
    with atomic():
        row = state_row(spec, now)
        if row.paused:
            return False
        row.paused, row.paused_at, row.next_fire_at, row.updated_at = True, now, None, now
        row.save(update_fields=["paused", "paused_at", "next_fire_at", "updated_at"])
    return True


def resume(name: str) -> bool:
    """Fire `name` again from its first slot after now. False when it was not paused."""
    spec = spec_of(name)
    now = clock.now()
    with atomic():
        row = state_row(spec, now)
        if not row.paused:
            return False
        row.paused, row.paused_at, row.updated_at = False, None, now
        row.cron, row.timezone = spec.cron.expr, spec.cron.timezone
        row.next_fire_at = spec.cron.next_after(now)
        row.save()
    return True


def ensure_rows(*, seen_on: str | None = None) -> None:
    """Give every defined schedule its state row (the admin lists rows). `seen_on`: an alias
    to look on first (the admin's replica): when it has every row, the engine's alias is not
    touched at all."""
    now = clock.now()
    specs = defined()
    if seen_on is not None and not _missing(specs, seen_on):
        return
    absent = _missing(specs)
    missing = [new_row(spec, now) for name, spec in specs.items() if name in absent]
    Schedule.objects.bulk_create(missing, ignore_conflicts=True)


def _missing(specs: dict[str, ScheduleSpec], using: str | None = None) -> set[str]:
    have = Schedule.objects.using(using).filter(name__in=list(specs)).values_list("name", flat=True)
    return set(specs) - set(have)
