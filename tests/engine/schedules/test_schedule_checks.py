"""manage.py check: a schedule that cannot fire is a system check error naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from tasks_engine.checks import check_schedules
from tasks_engine.definitions import Workflow, registry

pytestmark = pytest.mark.one_db("system checks of the SCHEDULES setting")


def errors(settings: Any, schedules: Any) -> list[tuple[str | None, str]]:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "SCHEDULES": schedules}
    return [(e.id, e.msg) for e in check_schedules()]


def test_valid_schedules_pass(settings: Any) -> None:
    assert (
        errors(
            settings,
            {
                "nightly-scan": {
                    "task": "repeat_names",
                    "cron": "0 3 * * *",
                    "input": {},
                    "timezone": "UTC",
                },
                "minimal": {"task": "noop", "cron": "*/5 * * * * *"},
                "with-input": {"task": "noop", "cron": "0 * * * *", "input": {"n": 3}},
            },
        )
        == []
    )


@pytest.mark.parametrize(
    ("entry", "code", "says"),
    [
        (
            {"task": "repeat_names", "cron": "61 * * * *"},
            "E202",
            "invalid cron expression '61 * * * *'",
        ),
        ({"task": "repeat_names", "cron": "daily"}, "E202", "expected 5 fields"),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "timezone": "Mars/Olympus"},
            "E203",
            "unknown timezone 'Mars/Olympus'",
        ),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "timezone": 1},
            "E203",
            "unknown timezone 1",
        ),
        # A tz database directory, or a name too long for a file name: ZoneInfo raises
        # OSError for these, not ZoneInfoNotFoundError.
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "timezone": "Europe"},
            "E203",
            "unknown timezone 'Europe'",
        ),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "timezone": "A" * 300},
            "E203",
            "unknown timezone 'AAA",
        ),
        ({"task": "no-such-task", "cron": "0 3 * * *"}, "E204", "unknown task 'no-such-task'"),
        (
            {"task": "noop", "cron": "0 3 * * *", "input": {"n": "many"}},
            "E205",
            "invalid input for task 'noop': n:",
        ),
        (
            {"task": "noop", "cron": "0 3 * * *", "input": {"n": float("nan")}},
            "E205",
            "invalid input",
        ),
        ({"task": "noop", "cron": "0 3 * * *", "input": [1]}, "E205", "invalid input"),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "input": {"x": {1, 2}}},
            "E205",
            "invalid input",
        ),
        # A lone surrogate: UTF-8 cannot encode it, so every fire failed (UnicodeEncodeError
        # in enqueue) and the schedules after this one never fired. Found by the audit.
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "input": {"x": "a\ud800"}},
            "E205",
            "invalid input for task 'repeat_names': x: ",
        ),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "input": {"\udc80": 1}},
            "E205",
            "invalid input",
        ),
        (
            {"task": "repeat_names", "cron": "0 3 * * *", "timezon": "UTC"},
            "E201",
            "unknown key(s) 'timezon'",
        ),
        ({"cron": "0 3 * * *"}, "E201", "needs 'task'"),
        ({"task": "repeat_names"}, "E201", "needs 'cron'"),
        ({"task": "repeat_names", "cron": 5}, "E201", "needs 'cron'"),
        ("0 3 * * *", "E201", "must be a dict"),
    ],
)
def test_bad_entries_are_errors_naming_the_schedule(
    settings: Any, entry: Any, code: str, says: str
) -> None:
    [(found, msg)] = errors(
        settings, {"nightly-scan": entry, "fine": {"task": "noop", "cron": "0 3 * * *"}}
    )
    assert found == f"tasks_engine.{code}"
    assert msg.startswith("schedule 'nightly-scan' (TASKS_ENGINE[\"SCHEDULES\"]): ")
    assert says in msg


def test_schedules_must_be_a_dict(settings: Any) -> None:
    [(code, msg)] = errors(settings, [{"task": "noop"}])
    assert code == "tasks_engine.E201" and "must be a dict" in msg


def test_a_name_too_long_for_the_idempotency_key(settings: Any) -> None:
    [(code, msg)] = errors(settings, {"x" * 201: {"task": "noop", "cron": "0 3 * * *"}})
    assert code == "tasks_engine.E201" and "at most 200" in msg


@pytest.mark.parametrize("name", ["nightly\x00scan", "nightly\ud800scan"])
def test_a_name_no_column_can_hold_is_an_error(settings: Any, name: str) -> None:
    # Such a name passed the check, then failed every round of the firing service (writing
    # the state row: a DataError on PostgreSQL, UnicodeEncodeError on both), so the other
    # schedules after it never fired. Found by the schedules audit.
    [(code, msg)] = errors(settings, {name: {"task": "noop", "cron": "0 3 * * *"}})
    assert code == "tasks_engine.E201" and "NUL" in msg


@pytest.fixture
def broken_workflow() -> Iterator[Workflow]:
    wf = registry.register(
        Workflow(
            fn=lambda ctx: None,
            name="library-scan",
            schedule="0 25 * * *",
            schedule_timezone="Europe/Berlin",
        )
    )
    yield wf
    registry.unregister(wf.name, wf.version)


def test_a_workflow_schedule_is_checked_too(settings: Any, broken_workflow: Workflow) -> None:
    [(code, msg)] = errors(settings, {})
    assert code == "tasks_engine.E202"
    assert msg.startswith("schedule 'library-scan' (schedule= of workflow 'library-scan'): ")


def test_a_settings_schedule_may_not_take_a_workflow_schedules_name(
    settings: Any, broken_workflow: Workflow
) -> None:
    broken_workflow.schedule = "0 3 * * *"
    [(code, msg)] = errors(settings, {"library-scan": {"task": "noop", "cron": "0 3 * * *"}})
    assert code == "tasks_engine.E201" and "taken by the schedule of workflow" in msg


def test_a_workflow_with_required_input_cannot_be_scheduled(settings: Any) -> None:
    from tests.testapp.workflows import Sleepy

    class Needs(Sleepy):
        path: str

    wf = registry.register(
        Workflow(fn=lambda ctx: None, name="needs-input", input_model=Needs, schedule="0 3 * * *")
    )
    try:
        [(code, msg)] = errors(settings, {})
    finally:
        registry.unregister(wf.name, wf.version)
    assert code == "tasks_engine.E205" and "path" in msg


@pytest.mark.django_db
def test_manage_py_check_fails(settings: Any) -> None:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {
            "nightly-scan": {
                "task": "repeat_names",
                "cron": "0 3 * * *",
                "timezone": "Nowhere/City",
            }
        },
    }
    with pytest.raises(SystemCheckError, match=r"tasks_engine.E203.*nightly-scan.*Nowhere/City"):
        call_command("check")
