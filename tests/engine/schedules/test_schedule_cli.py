"""manage.py tasks schedules [--json] and tasks schedule pause|resume NAME."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tasks_engine import schedules
from tasks_engine.models import Schedule, WorkflowRun
from tests.helpers import ROOT, FakeClock, database_url

pytestmark = pytest.mark.django_db


def tasks(*args: str) -> str:
    out = StringIO()
    call_command("tasks", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def defined(settings: Any, fake_clock: FakeClock) -> FakeClock:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {
            "nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *", "timezone": "UTC"},
            "berlin": {"task": "noop", "cron": "30 2 * * *", "timezone": "Europe/Berlin"},
        },
    }
    fake_clock.current = datetime(2026, 12, 1, 12, tzinfo=UTC)
    return fake_clock


def test_schedules_json_lists_every_field(defined: FakeClock) -> None:
    schedules.run_once()
    defined.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    run = WorkflowRun.objects.get(task_name="repeat_names")
    listed = json.loads(tasks("schedules", "--json"))
    assert listed == [
        {
            "name": "berlin",
            "task": "noop",
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "paused": False,
            "next_fire_at": "2026-12-03T01:30:00+00:00",
            "last_slot_at": "2026-12-02T01:30:00+00:00",
            "last_fired_at": "2026-12-02T03:00:01+00:00",
            "last_run_id": str(WorkflowRun.objects.get(task_name="noop").pk),
            "last_error": "",
        },
        {
            "name": "nightly-scan",
            "task": "repeat_names",
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "paused": False,
            "next_fire_at": "2026-12-03T03:00:00+00:00",
            "last_slot_at": "2026-12-02T03:00:00+00:00",
            "last_fired_at": "2026-12-02T03:00:01+00:00",
            "last_run_id": str(run.pk),
            "last_error": "",
        },
    ]
    text = tasks("schedules")
    assert "nightly-scan" in text and str(run.pk) in text and "active" in text


@pytest.fixture
def every_minute(settings: Any, fake_clock: FakeClock) -> FakeClock:
    settings.TASKS_ENGINE = {
        **settings.TASKS_ENGINE,
        "SCHEDULES": {"minutely": {"task": "noop", "cron": "* * * * *", "timezone": "UTC"}},
    }
    fake_clock.current = datetime(2026, 12, 1, 14, 18, 30, tzinfo=UTC)
    schedules.run_once()  # the leader's last round: next fire 14:19
    return fake_clock


def test_missed_slots_list_the_latest_one_which_is_the_one_that_fires(
    every_minute: FakeClock,
) -> None:
    every_minute.current = datetime(2026, 12, 1, 14, 20, 30, tzinfo=UTC)  # no leader since
    assert Schedule.objects.get().next_fire_at == datetime(2026, 12, 1, 14, 19, tzinfo=UTC)
    [listed] = json.loads(tasks("schedules", "--json"))
    assert listed["next_fire_at"] == "2026-12-01T14:20:00+00:00"
    text = tasks("schedules")
    assert "next=2026-12-01T14:20:00+00:00 (missed)" in text and "14:19" not in text
    assert schedules.run_once() == {"fired": 1, "failed": 0}  # the leader runs again
    run = WorkflowRun.objects.get()
    assert run.idempotency_key == f"schedule:minutely:{listed['next_fire_at']}"
    [listed] = json.loads(tasks("schedules", "--json"))
    assert (listed["next_fire_at"], listed["last_run_id"]) == (
        "2026-12-01T14:21:00+00:00",
        str(run.pk),
    )
    assert "(missed)" not in tasks("schedules")


def test_a_paused_schedule_has_no_next_fire_after_a_gap(every_minute: FakeClock) -> None:
    tasks("schedule", "pause", "minutely")
    every_minute.current = datetime(2026, 12, 1, 15, tzinfo=UTC)
    [listed] = json.loads(tasks("schedules", "--json"))
    assert (listed["paused"], listed["next_fire_at"]) == (True, None)
    assert "paused  next=- " in tasks("schedules")


def test_pause_and_resume_from_the_cli(defined: FakeClock) -> None:
    assert json.loads(tasks("schedule", "pause", "nightly-scan", "--json")) == {
        "name": "nightly-scan",
        "paused": True,
        "changed": True,
    }
    assert tasks("schedule", "pause", "nightly-scan").strip() == "nightly-scan was already paused"
    [_, paused] = json.loads(tasks("schedules", "--json"))
    assert (paused["paused"], paused["next_fire_at"]) == (True, None)
    assert tasks("schedule", "resume", "nightly-scan").strip() == "resumed nightly-scan"
    assert tasks("schedule", "resume", "nightly-scan").strip() == "nightly-scan was not paused"
    assert not Schedule.objects.get(name="nightly-scan").paused


def test_unknown_schedule_is_a_command_error(defined: FakeClock) -> None:
    with pytest.raises(CommandError, match=r"^unknown schedule 'nope'$"):
        tasks("schedule", "pause", "nope")
    assert not Schedule.objects.exists()


def test_no_schedules(settings: Any) -> None:
    assert tasks("schedules").strip() == "(no schedules)"
    assert json.loads(tasks("schedules", "--json")) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedule", "pause", "nope"], "CommandError: unknown schedule 'nope'"),
        (["schedule", "stop", "nope"], "invalid choice: 'stop'"),
        (["schedule", "pause"], "the following arguments are required: NAME"),
    ],
)
def test_errors_are_one_line_and_exit_non_zero(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks", *args],
        cwd=ROOT,
        env={
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PATH": "",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
