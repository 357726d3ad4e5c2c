"""The firing service (tasks_engine/schedules/firing.py): one run per slot, the latest missed
slot once after downtime, pause/resume kept in the state row, definitions that change or go."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from tasks_engine import schedules
from tasks_engine.definitions import Workflow, registry
from tasks_engine.exceptions import UnknownScheduleError
from tasks_engine.models import Schedule, WorkflowRun
from tasks_engine.schedules import firing
from tests.helpers import FakeClock

pytestmark = pytest.mark.django_db

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock_at(fake_clock: FakeClock) -> FakeClock:
    fake_clock.current = START
    return fake_clock


def define(settings: Any, **entries: dict[str, Any]) -> None:
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "SCHEDULES": entries}


@pytest.fixture
def nightly(settings: Any, clock_at: FakeClock) -> FakeClock:
    """nightly-scan: repeat_names at 03:00 UTC; the clock at START (12:00 on Dec 1)."""
    define(settings, **{"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}})
    return clock_at


@pytest.fixture
def scheduled_workflow() -> Iterator[Workflow]:
    """A workflow with schedule= in Europe/Berlin, registered for the test only."""
    wf = registry.register(
        Workflow(
            fn=lambda ctx: {"scanned": True},
            name="library-scan",
            schedule="0 3 * * *",
            schedule_timezone="Europe/Berlin",
        )
    )
    yield wf
    registry.unregister(wf.name, wf.version)


def keys() -> list[str | None]:
    return list(
        WorkflowRun.objects.order_by("created_at").values_list("idempotency_key", flat=True)
    )


def row(name: str = "nightly-scan") -> Schedule:
    return Schedule.objects.get(name=name)


def test_a_new_schedule_waits_for_its_first_slot(nightly: FakeClock) -> None:
    assert schedules.run_once() == {"fired": 0, "failed": 0}
    assert keys() == []
    state = row()
    assert state.next_fire_at == datetime(2026, 12, 2, 3, tzinfo=UTC)
    assert (state.cron, state.timezone, state.paused) == ("0 3 * * *", "UTC", False)


def test_each_slot_fires_one_run_with_the_slot_key(nightly: FakeClock) -> None:
    schedules.run_once()
    nightly.current = datetime(2026, 12, 2, 3, 0, 0, 400000, tzinfo=UTC)
    assert schedules.run_once() == {"fired": 1, "failed": 0}
    assert schedules.run_once() == {"fired": 0, "failed": 0}  # the same slot: nothing more
    assert keys() == ["schedule:nightly-scan:2026-12-02T03:00:00+00:00"]
    run = WorkflowRun.objects.get()
    assert (run.task_name, run.input, run.status) == ("repeat_names", {}, "pending")
    state = row()
    assert state.last_run_id == run.pk
    assert state.last_slot_at == datetime(2026, 12, 2, 3, tzinfo=UTC)
    assert state.next_fire_at == datetime(2026, 12, 3, 3, tzinfo=UTC)
    nightly.current = datetime(2026, 12, 3, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    assert keys()[-1] == "schedule:nightly-scan:2026-12-03T03:00:00+00:00"


def test_after_downtime_only_the_latest_missed_slot_fires(nightly: FakeClock) -> None:
    schedules.run_once()  # first seen at 12:00 Dec 1: next fire Dec 2 03:00
    nightly.current = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)  # no worker for five days
    assert schedules.run_once() == {"fired": 1, "failed": 0}
    assert keys() == ["schedule:nightly-scan:2026-12-07T03:00:00+00:00"]
    assert row().next_fire_at == datetime(2026, 12, 8, 3, tzinfo=UTC)
    nightly.current = datetime(2026, 12, 8, 3, 0, 5, tzinfo=UTC)
    schedules.run_once()
    assert len(keys()) == 2  # and then it goes on


def test_input_from_settings_is_the_runs_input(settings: Any, clock_at: FakeClock) -> None:
    define(settings, every={"task": "noop", "cron": "*/10 * * * * *", "input": {"n": 7}})
    schedules.run_once()
    clock_at.advance(10)
    schedules.run_once()
    assert WorkflowRun.objects.get().input == {"n": 7}


def test_workflow_schedule_fires_in_its_timezone_with_empty_input(
    clock_at: FakeClock, scheduled_workflow: Workflow
) -> None:
    schedules.run_once()
    assert row("library-scan").next_fire_at == datetime(2026, 12, 2, 2, tzinfo=UTC)  # 03:00 CET
    clock_at.current = datetime(2026, 12, 2, 2, 0, 1, tzinfo=UTC)
    schedules.run_once()
    run = WorkflowRun.objects.get()
    assert (run.task_name, run.input) == ("library-scan", {})
    assert run.idempotency_key == "schedule:library-scan:2026-12-02T02:00:00+00:00"


def test_dst_days_in_berlin_fire_once_each(settings: Any, fake_clock: FakeClock) -> None:
    """02:30 daily: on the spring day (no 02:30) it fires at the jump, on the autumn day (two
    02:30s) once; checked through the service, hour by hour across both days."""
    define(
        settings, dst={"task": "repeat_names", "cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    )
    for day in (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 10, 24, 12, tzinfo=UTC)):
        fake_clock.current = day
        schedules.run_once()
        for _ in range(48 * 6):  # every ten minutes for two days
            fake_clock.advance(600)
            schedules.run_once()
    assert keys() == [
        "schedule:dst:2026-03-29T01:00:00+00:00",  # 03:00 CEST, the jump
        "schedule:dst:2026-03-30T00:30:00+00:00",
        "schedule:dst:2026-10-24T00:30:00+00:00",  # the jump to October: latest missed slot
        "schedule:dst:2026-10-25T00:30:00+00:00",  # the first 02:30 (CEST) only
        "schedule:dst:2026-10-26T01:30:00+00:00",
    ]


def test_a_lost_state_write_still_enqueues_one_run_per_slot(nightly: FakeClock) -> None:
    """Second line of defence: a caller whose view of the row is stale (its slot already
    fired) gets the same run back from the idempotency key instead of a second one."""
    schedules.run_once()
    nightly.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    first = row().last_run_id
    Schedule.objects.update(next_fire_at=datetime(2026, 12, 2, 3, tzinfo=UTC), last_run_id=None)
    assert schedules.run_once() == {"fired": 1, "failed": 0}
    assert WorkflowRun.objects.count() == 1
    assert row().last_run_id == first


def test_a_slot_whose_key_holds_other_input_fails_alone_and_the_next_fires(
    settings: Any, clock_at: FakeClock
) -> None:
    define(
        settings,
        a={"task": "noop", "cron": "0 3 * * *", "input": {"n": 1}},
        b={"task": "repeat_names", "cron": "0 3 * * *"},
    )
    schedules.run_once()
    from tasks_engine import enqueue

    taken = enqueue("noop", {"n": 2}, idempotency_key="schedule:a:2026-12-02T03:00:00+00:00")
    clock_at.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    assert schedules.run_once() == {"fired": 1, "failed": 1}
    a = row("a")
    assert "IdempotencyConflict" in a.last_error and a.last_run_id is None
    assert a.next_fire_at == datetime(2026, 12, 3, 3, tzinfo=UTC)  # given up, not retried
    assert WorkflowRun.objects.filter(task_name="noop").get().pk == taken.run_id
    clock_at.current = datetime(2026, 12, 3, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    assert row("a").last_error == "" and row("a").last_run_id is not None


@pytest.fixture
def keyed_by_disk() -> Iterator[Workflow]:
    """A workflow whose concurrency key callable needs input a schedule may not give."""
    wf = registry.register(
        Workflow(fn=lambda ctx: None, name="keyed-by-disk", concurrency_key=lambda i: i["disk"])
    )
    yield wf
    registry.unregister(wf.name, wf.version)


def test_a_fire_whose_enqueue_raises_fails_alone_and_the_others_fire(
    settings: Any, clock_at: FakeClock, keyed_by_disk: Workflow
) -> None:
    # enqueue refuses the run (ValueError: the key callable raised KeyError): that used to
    # fail the whole round, every second, so the schedules after it never fired. Found by
    # the schedules audit.
    define(
        settings,
        a={"task": "keyed-by-disk", "cron": "0 3 * * *"},
        b={"task": "repeat_names", "cron": "0 3 * * *"},
    )
    schedules.run_once()
    clock_at.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    assert schedules.run_once() == {"fired": 1, "failed": 1}
    a = row("a")
    assert "ValueError" in a.last_error and "concurrency_key" in a.last_error
    assert a.next_fire_at == datetime(2026, 12, 3, 3, tzinfo=UTC)  # given up, not retried
    assert row("b").last_run_id is not None
    assert not WorkflowRun.objects.filter(task_name="keyed-by-disk").exists()


@pytest.fixture
def leaky_key() -> Iterator[Workflow]:
    """A workflow whose key callable fails with a database URL, password and all, in its
    message (the password long enough to straddle last_error's 2,000-character cut)."""

    def key(i: Any) -> str:
        raise RuntimeError(f"{'x' * i['pad']} postgres://u:{'secret' * 100}@h/db unreachable")

    wf = registry.register(Workflow(fn=lambda ctx: None, name="leaky-key", concurrency_key=key))
    yield wf
    registry.unregister(wf.name, wf.version)


@pytest.mark.parametrize("pad", [0, 1700], ids=["short", "cut-in-the-password"])
def test_a_failed_fires_stored_error_is_redacted_as_its_log_line(
    settings: Any, clock_at: FakeClock, leaky_key: Workflow, pad: int
) -> None:
    define(settings, a={"task": "leaky-key", "cron": "0 3 * * *", "input": {"pad": pad}})
    schedules.run_once()
    clock_at.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    assert schedules.run_once() == {"fired": 0, "failed": 1}
    error = row("a").last_error
    assert "RuntimeError" in error and "postgres://u:" in error
    assert "secret" not in error and len(error) <= 2000


def test_pause_stops_fires_and_resume_goes_on_from_the_next_slot(nightly: FakeClock) -> None:
    schedules.run_once()
    assert schedules.pause("nightly-scan") is True
    assert schedules.pause("nightly-scan") is False  # already paused
    for day in (2, 3, 4):
        nightly.current = datetime(2026, 12, day, 3, 0, 1, tzinfo=UTC)
        schedules.run_once()
    assert keys() == []
    assert row().paused and row().next_fire_at is None
    nightly.current = datetime(2026, 12, 4, 10, tzinfo=UTC)
    assert schedules.resume("nightly-scan") is True
    assert schedules.resume("nightly-scan") is False
    assert row().next_fire_at == datetime(2026, 12, 5, 3, tzinfo=UTC)
    schedules.run_once()
    assert keys() == []  # the slots missed while paused are not fired
    nightly.current = datetime(2026, 12, 5, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    assert keys() == ["schedule:nightly-scan:2026-12-05T03:00:00+00:00"]


def test_pause_before_any_round_creates_the_row_paused(nightly: FakeClock) -> None:
    assert schedules.pause("nightly-scan")
    nightly.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    assert keys() == [] and row().paused


def test_unknown_schedule_names_are_refused_and_write_nothing(nightly: FakeClock) -> None:
    for act in (schedules.pause, schedules.resume):
        with pytest.raises(UnknownScheduleError, match="unknown schedule 'nope'"):
            act("nope")
    assert not Schedule.objects.exists()


def test_a_changed_cron_starts_from_its_next_slot(settings: Any, nightly: FakeClock) -> None:
    schedules.run_once()
    define(settings, **{"nightly-scan": {"task": "repeat_names", "cron": "0 5 * * *"}})
    nightly.current = datetime(2026, 12, 2, 4, tzinfo=UTC)  # the old 03:00 slot has passed
    schedules.run_once()
    assert keys() == []
    assert row().next_fire_at == datetime(2026, 12, 2, 5, tzinfo=UTC)
    assert row().cron == "0 5 * * *"


def test_a_removed_schedule_keeps_its_row_and_fires_nothing(settings: Any, nightly: FakeClock):
    schedules.run_once()
    schedules.pause("nightly-scan")
    define(settings)
    nightly.current = datetime(2026, 12, 9, tzinfo=UTC)
    schedules.run_once()
    state = row()
    assert state.paused and state.cron == "" and state.next_fire_at is None
    define(settings, **{"nightly-scan": {"task": "repeat_names", "cron": "0 3 * * *"}})
    schedules.resume("nightly-scan")
    schedules.run_once()
    assert keys() == []  # back again: from the next slot, nothing for the time it was gone
    assert row().next_fire_at == datetime(2026, 12, 9, 3, tzinfo=UTC)


def test_invalid_schedules_are_skipped_by_the_service(settings: Any, clock_at: FakeClock) -> None:
    define(
        settings,
        bad={"task": "repeat_names", "cron": "61 * * * *"},
        ok={"task": "repeat_names", "cron": "* * * * * *"},
    )
    schedules.run_once()
    clock_at.advance(2)
    assert schedules.run_once() == {"fired": 1, "failed": 0}
    assert list(Schedule.objects.values_list("name", flat=True)) == ["ok"]


@pytest.mark.parametrize("bad", ["nul\x00name", "surrogate\udc80name"])
def test_a_name_no_column_can_hold_is_skipped_by_the_service(
    settings: Any, clock_at: FakeClock, bad: str
) -> None:
    define(
        settings,
        **{
            bad: {"task": "repeat_names", "cron": "* * * * * *"},
            "ok": {"task": "repeat_names", "cron": "* * * * * *"},
        },
    )
    schedules.run_once()
    clock_at.advance(2)
    assert schedules.run_once() == {"fired": 1, "failed": 0}
    assert list(Schedule.objects.values_list("name", flat=True)) == ["ok"]


def test_list_shows_next_fire_and_last_run(nightly: FakeClock) -> None:
    [view] = schedules.list_schedules()  # before any round: the next fire it will get
    assert (view.name, view.task, view.next_fire_at) == (
        "nightly-scan",
        "repeat_names",
        datetime(2026, 12, 2, 3, tzinfo=UTC),
    )
    schedules.run_once()
    nightly.current = datetime(2026, 12, 2, 3, 0, 1, tzinfo=UTC)
    schedules.run_once()
    [view] = schedules.list_schedules()
    assert view.last_run_id == WorkflowRun.objects.get().pk
    assert view.to_dict()["next_fire_at"] == "2026-12-03T03:00:00+00:00"


def fired_slot() -> str:
    """The slot of the one run fired so far, from its key schedule:<name>:<slot>."""
    [key] = keys()
    assert key is not None
    return key.split(":", 2)[2]


@pytest.mark.parametrize(
    ("cron", "gap_until", "fires"),
    [
        # the audit's case: stored next 14:19, listed at 14:20:30, the leader fires 14:20
        ("* * * * *", datetime(2026, 12, 1, 14, 20, 30), datetime(2026, 12, 1, 14, 20)),
        # only the first slot missed: it is the one
        ("* * * * *", datetime(2026, 12, 1, 14, 19, 30), datetime(2026, 12, 1, 14, 19)),
        # days without a leader
        ("0 3 * * *", datetime(2026, 12, 7, 9, 0), datetime(2026, 12, 7, 3, 0)),
        ("*/5 * * * * *", datetime(2026, 12, 1, 16, 0, 2), datetime(2026, 12, 1, 16, 0)),
    ],
)
def test_after_a_gap_with_no_leader_the_listed_next_fire_is_the_slot_that_fires(
    settings: Any, fake_clock: FakeClock, cron: str, gap_until: datetime, fires: datetime
) -> None:
    define(settings, gap={"task": "repeat_names", "cron": cron})
    fake_clock.current = datetime(2026, 12, 1, 14, 18, 30, tzinfo=UTC)
    schedules.run_once()  # the leader's last round before the gap
    stored = row("gap").next_fire_at
    fake_clock.current = gap_until.replace(tzinfo=UTC)  # no leader ran since
    [view] = schedules.list_schedules()
    assert stored is not None and stored <= fake_clock.current  # the stored slot is past
    assert view.next_fire_at == fires.replace(tzinfo=UTC)
    assert schedules.run_once() == {"fired": 1, "failed": 0}  # the leader is back
    assert fired_slot() == view.to_dict()["next_fire_at"]
    [after] = schedules.list_schedules()  # and then the next future slot
    assert after.next_fire_at == row("gap").next_fire_at
    assert after.next_fire_at is not None and after.next_fire_at > fake_clock.current


def test_a_paused_schedule_lists_no_next_fire_however_long_no_leader_ran(
    nightly: FakeClock,
) -> None:
    schedules.run_once()
    nightly.current = datetime(2026, 12, 7, 9, tzinfo=UTC)
    schedules.pause("nightly-scan")
    [view] = schedules.list_schedules()
    assert (view.paused, view.next_fire_at) == (True, None)
    assert schedules.run_once() == {"fired": 0, "failed": 0}  # and none fires
    schedules.resume("nightly-scan")
    [view] = schedules.list_schedules()
    assert view.next_fire_at == datetime(2026, 12, 8, 3, tzinfo=UTC)


def test_a_changed_cron_lists_the_slot_its_next_round_starts_from(
    settings: Any, nightly: FakeClock
) -> None:
    schedules.run_once()  # stored next fire: 03:00 Dec 2 for "0 3 * * *"
    define(settings, **{"nightly-scan": {"task": "repeat_names", "cron": "0 5 * * *"}})
    nightly.current = datetime(2026, 12, 2, 4, tzinfo=UTC)  # the old slot is past, not fired
    [view] = schedules.list_schedules()
    assert view.next_fire_at == datetime(2026, 12, 2, 5, tzinfo=UTC)
    assert schedules.run_once() == {"fired": 0, "failed": 0}
    assert row().next_fire_at == view.next_fire_at


@pytest.mark.django_db(transaction=True)
def test_concurrent_rounds_enqueue_one_run_per_slot(settings: Any, fake_clock: FakeClock) -> None:
    """Two threads (two connections) run rounds at the same instants; both pass the unlocked
    read that says a slot is due before either fires it."""
    define(settings, fast={"task": "repeat_names", "cron": "*/5 * * * * *"})
    fake_clock.current = START
    schedules.run_once()
    both_due = threading.Barrier(2, timeout=30)
    step = threading.Barrier(3, timeout=30)
    real = firing.fire_if_due
    errors: list[Exception] = []

    def fire_together(spec: Any, now: datetime) -> str | None:
        both_due.wait()
        return real(spec, now)

    def caller() -> None:
        try:
            for _ in range(SLOTS):
                step.wait()
                schedules.run_once()
                step.wait()
        except Exception as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)
            step.abort()
        finally:
            connection.close()

    SLOTS = 6
    firing.fire_if_due = fire_together  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=caller) for _ in range(2)]
        for t in threads:
            t.start()
        for _ in range(SLOTS):
            fake_clock.advance(5)
            step.wait()  # both run a round at this instant
            step.wait()
        for t in threads:
            t.join(30)
    finally:
        firing.fire_if_due = real  # type: ignore[assignment]
    assert errors == []
    expected = [
        f"schedule:fast:{(START + timedelta(seconds=5 * i)).isoformat()}"
        for i in range(1, SLOTS + 1)
    ]
    assert keys() == expected
