"""Which schedules are defined: `@workflow(schedule=...)` and `TASKS_ENGINE["SCHEDULES"]`.

`collect()` returns the usable definitions and a problem for each unusable one; the system
check (tasks_engine/checks.py) reports the problems, and the firing service skips those
schedules instead of failing every round.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from pydantic import ValidationError

from ..definitions import Workflow, registry
from ..exceptions import UnknownTaskError
from .instants import Cron, InvalidSchedule

SETTINGS_KEYS = {"task", "cron", "input", "timezone"}
MAX_NAME = 200  # the key schedule:<name>:<slot> must fit an idempotency key (255)


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    task: str
    cron: Cron
    input: Any
    source: str  # "workflow" (its schedule=) or "settings" (TASKS_ENGINE["SCHEDULES"])


@dataclass(frozen=True)
class Problem:
    name: str
    source: str
    message: str
    code: str  # the system check's id in tasks_engine (see CODES)


# System check ids (tasks_engine.E2xx): what is wrong with a schedule.
CODES = {
    "malformed": "E201",  # not a dict, unknown or missing keys, bad name, name taken
    "cron": "E202",  # invalid cron expression
    "timezone": "E203",  # unknown timezone
    "task": "E204",  # unknown task
    "input": "E205",  # input the task does not accept
}


def collect() -> tuple[dict[str, ScheduleSpec], list[Problem]]:
    specs: dict[str, ScheduleSpec] = {}
    problems: list[Problem] = []
    for wf in _scheduled_workflows():
        _add(
            _spec(wf.name, wf.name, wf.schedule, wf.schedule_timezone, {}, "workflow"),
            specs,
            problems,
        )
    raw = (getattr(settings, "TASKS_ENGINE", None) or {}).get("SCHEDULES") or {}
    if not isinstance(raw, dict):
        problems.append(
            _problem("SCHEDULES", "settings", "malformed", "must be a dict of name -> schedule")
        )
        return specs, problems
    for name, entry in raw.items():
        if name in specs:
            taken = f"the name is taken by the schedule of workflow {name!r}"
            problems.append(_problem(name, "settings", "malformed", taken))
            continue
        _add(_settings_spec(name, entry), specs, problems)
    return specs, problems


def defined() -> dict[str, ScheduleSpec]:
    """The usable schedules by name."""
    return collect()[0]


def _problem(name: Any, source: str, what: str, message: str) -> Problem:
    return Problem(str(name), source, message, CODES[what])


def _add(
    found: ScheduleSpec | Problem, specs: dict[str, ScheduleSpec], problems: list[Problem]
) -> None:
    if isinstance(found, Problem):
        problems.append(found)
    else:
        specs[found.name] = found


def _scheduled_workflows() -> list[Workflow]:
    """The highest version of each workflow, when it has a schedule: new runs use it."""
    newest: dict[str, int] = defaultdict(int)
    for name, version in registry.pairs():
        newest[name] = max(newest[name], version)
    found = [registry.get(name, version) for name, version in sorted(newest.items())]
    return [wf for wf in found if wf.schedule is not None]


def _settings_spec(name: Any, entry: Any) -> ScheduleSpec | Problem:
    if not isinstance(entry, dict):
        return _problem(name, "settings", "malformed", "must be a dict with 'task' and 'cron'")
    unknown = sorted(map(str, set(entry) - SETTINGS_KEYS))
    if unknown:
        allowed = ", ".join(sorted(SETTINGS_KEYS))
        message = f"unknown key(s) {', '.join(map(repr, unknown))}; allowed: {allowed}"
        return _problem(name, "settings", "malformed", message)
    for key in ("task", "cron"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            return _problem(name, "settings", "malformed", f"needs {key!r} (a non-empty string)")
    timezone = entry.get("timezone", "UTC")
    return _spec(name, entry["task"], entry["cron"], timezone, entry.get("input", {}), "settings")


def _spec(
    name: Any, task: str, cron: Any, timezone: Any, input: Any, source: str
) -> ScheduleSpec | Problem:
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        message = f"the name must be a non-empty string of at most {MAX_NAME} characters"
        return _problem(name, source, "malformed", message)
    if not storable(name):
        message = "the name must not hold a NUL or a character UTF-8 cannot encode"
        return _problem(name, source, "malformed", message)
    try:
        parsed = Cron(cron, timezone)
    except InvalidSchedule as exc:
        return _problem(name, source, exc.what, str(exc))
    try:
        stored = registry.get(task).validate_input(input)
    except UnknownTaskError as exc:
        return _problem(name, source, "task", str(exc))
    except ValidationError as exc:
        return _problem(
            name, source, "input", f"invalid input for task {task!r}: {first_error(exc)}"
        )
    where = unencodable(stored)
    if where is not None:
        at = ".".join(where).encode("utf-8", "backslashreplace").decode() or "input"
        message = f"invalid input for task {task!r}: {at}: a string UTF-8 cannot encode"
        return _problem(name, source, "input", message)
    return ScheduleSpec(name, task, parsed, input, source)


def first_error(exc: ValidationError) -> str:
    """`where: what` of a pydantic error's first problem."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ())) or "input"
    return f"{where}: {first['msg']}"


def storable(text: str) -> bool:
    """Whether a text column can hold `text`: PostgreSQL's text refuses NUL, and neither
    database can store a lone surrogate (it is not encodable as UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unencodable(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where a JSON value holds a string (or key) with a lone surrogate, which no database
    column can store (validate_input lets it through; enqueue then fails), or None."""
    if isinstance(value, str):
        return None if storable(value.replace("\x00", "")) else path
    if isinstance(value, dict):
        for key, item in value.items():
            key_path = (*path, str(key))
            if isinstance(key, str) and not storable(key.replace("\x00", "")):
                return key_path
            found = unencodable(item, key_path)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = unencodable(item, (*path, str(i)))
            if found is not None:
                return found
    return None
