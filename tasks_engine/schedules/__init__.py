"""Schedules: workflows fired on cron expressions, one run per slot, by the maintenance leader.

Defined by `@workflow(schedule="0 3 * * *", schedule_timezone="Europe/Berlin")` (named after
the workflow, input {}) or `TASKS_ENGINE["SCHEDULES"]` (`{"name": {"task", "cron", "input",
"timezone"}}`). State (paused, last slot and run, next fire) is a `tasks_engine.Schedule` row.

  slots.py    cron expression + timezone -> slots in UTC (cronsim; DST rules there)
  specs.py    the defined schedules, and what is wrong with the others (system checks)
  firing.py   run_once(): the leader's service
  control.py  list, pause, resume (CLI, admin)

See docs/schedules.md.
"""

from __future__ import annotations

from .control import ScheduleView, ensure_rows, list_schedules, pause, resume
from .firing import next_fire, run_once
from .instants import Cron, InvalidSchedule, idempotency_key
from .specs import ScheduleSpec, collect, defined

__all__ = [
    "Cron",
    "InvalidSchedule",
    "ScheduleSpec",
    "ScheduleView",
    "collect",
    "defined",
    "ensure_rows",
    "idempotency_key",
    "list_schedules",
    "next_fire",
    "pause",
    "resume",
    "run_once",
]

# How often the maintenance leader runs `run_once()`: slots are fired within about a second.
EVERY_SECONDS = 1.0
