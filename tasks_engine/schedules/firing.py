"""The firing service: `run_once()` enqueues the run of every schedule whose slot has come.

The maintenance leader calls it about every second (services.register in apps.py). One run per
slot, however many processes call it at once: each fire locks the schedule's state row and
enqueues with the key `schedule:<name>:<slot>` in the same transaction, so a second caller
either waits for the row and finds the slot fired, or (had it read the row first) finds the
key taken and gets the same run back.

After downtime only the latest missed slot fires, once; the schedule then goes on from the
first slot after it. A new schedule, or one whose cron or timezone changed, starts at its
first slot after that moment: nothing fires for the past.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from .. import clock
from ..db.alias import atomic, on_commit
from ..engine import enqueue
from ..exceptions import IdempotencyConflict, UnknownTaskError
from ..models import Schedule
from ..observe.logs import get_logger
from ..values.secrets import redact_text
from .instants import idempotency_key
from .specs import ScheduleSpec, defined


def run_once() -> dict[str, int]:
    """One round: fire every due schedule; returns counts of fired and failed fires."""
    now = clock.now()
    specs = defined()
    rows = {row.name: row for row in Schedule.objects.all()}
    counts = {"fired": 0, "failed": 0}
    forget_removed([name for name, row in rows.items() if row.cron and name not in specs], now)
    for spec in specs.values():
        row = rows.get(spec.name)
        if row is not None and in_step(row, spec) and not _due(row, now):
            continue  # the usual round: one read, no write
        outcome = fire_if_due(spec, now)
        if outcome is not None:
            counts[outcome] += 1
    return counts


def in_step(row: Schedule, spec: ScheduleSpec) -> bool:
    """The row's next fire was computed for this definition."""
    return row.cron == spec.cron.expr and row.timezone == spec.cron.timezone


def _due(row: Schedule, now: datetime) -> bool:
    return not row.paused and row.next_fire_at is not None and row.next_fire_at <= now


def due_slot(row: Schedule, spec: ScheduleSpec, now: datetime) -> datetime | None:
    """The slot a round at `now` fires for an in-step row, None when none is due: the latest
    slot in [next fire, `now`], which after downtime is the latest missed one."""
    if not _due(row, now):
        return None
    assert row.next_fire_at is not None
    return spec.cron.latest_at_or_before(now, not_before=row.next_fire_at)


def next_fire(spec: ScheduleSpec | None, row: Schedule | None, now: datetime) -> datetime | None:
    """The slot that fires next as seen at `now`, for listings (CLI, admin): what the next
    round would do with this row. A slot already due (missed while no leader ran) is the one
    `due_slot` fires, the latest missed one, not the first missed one the row stores; a
    schedule that is paused or no longer defined has none; one no round has seen since it was
    defined or changed starts from its first slot after `now`."""
    if spec is None or (row is not None and row.paused):
        return None
    if row is None or not in_step(row, spec):
        return spec.cron.next_after(now)
    return due_slot(row, spec, now) or row.next_fire_at


def forget_removed(names: list[str], now: datetime) -> None:
    """Schedules no longer defined keep their row (pause, last run) but no next fire; if one is
    defined again it starts afresh rather than firing for the time it was gone."""
    if names:
        Schedule.objects.filter(name__in=names).update(
            cron="", timezone="", next_fire_at=None, updated_at=now
        )


def new_row(spec: ScheduleSpec, now: datetime) -> Schedule:
    """A schedule first seen at `now` fires from its first slot after `now`."""
    return Schedule(
        name=spec.name,
        cron=spec.cron.expr,
        timezone=spec.cron.timezone,
        next_fire_at=spec.cron.next_after(now),
        created_at=now,
        updated_at=now,
    )


def state_row(spec: ScheduleSpec, now: datetime) -> Schedule:
    """The schedule's row, created if missing, locked until the transaction ends (on SQLite
    the transaction's BEGIN IMMEDIATE already serialises writers)."""
    Schedule.objects.bulk_create([new_row(spec, now)], ignore_conflicts=True)
    return Schedule.objects.select_for_update().get(name=spec.name)


def fire_if_due(spec: ScheduleSpec, now: datetime) -> str | None:
    with atomic():
        row = state_row(spec, now)
        if not in_step(row, spec):
            row.cron, row.timezone = spec.cron.expr, spec.cron.timezone
            row.next_fire_at = None if row.paused else spec.cron.next_after(now)
            row.updated_at = now
            row.save(update_fields=["cron", "timezone", "next_fire_at", "updated_at"])
            return None
        slot = due_slot(row, spec, now)
        if slot is None:
            return None  # paused meanwhile, or another caller fired this slot
        outcome = _enqueue(spec, row, slot, now)
        row.last_slot_at, row.last_fired_at = slot, now
        row.next_fire_at = spec.cron.next_after(slot)
        row.updated_at = now
        row.save()
    return outcome


def _enqueue(spec: ScheduleSpec, row: Schedule, slot: datetime, now: datetime) -> str:
    # Logged once committed: a fire rolled back (an outage, a kill) was not a fire. `at` is
    # the round's time, at which `slot` was the latest due.
    log = get_logger(schedule=spec.name, slot=slot.isoformat(), at=now.isoformat())
    first_due = row.next_fire_at
    key = idempotency_key(spec.name, slot)
    try:
        res = enqueue(spec.task, spec.input, idempotency_key=key)
    except (UnknownTaskError, ValidationError, IdempotencyConflict, ValueError, TypeError) as exc:
        # The definition is broken (manage.py check says so), or enqueue refused the run (a
        # key callable that raised, say: ValueError): this slot is given up, not retried every
        # second, and the round goes on with the other schedules; the next slot tries again.
        # Shown in the admin and `schedules list`: secrets redacted as in the log line, before
        # the cut (a URL cut before its `@` would keep its password).
        error = f"{key}: {redact_text(f'{type(exc).__name__}: {exc}')}"[:2000]
        row.last_error = error
        on_commit(lambda: log.error("schedule_fire_failed", error=error))
        return "failed"
    row.last_run_id, row.last_error = res.run_id, ""
    missed = first_due.isoformat() if first_due is not None and first_due != slot else None
    on_commit(
        lambda: log.info(
            "schedule_fired",
            run_id=str(res.run_id),
            deduplicated=res.deduplicated,
            first_missed_slot=missed,
        )
    )
    return "fired"
