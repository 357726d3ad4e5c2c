"""Schedules fired by the maintenance leader of real `runworker` processes (PostgreSQL and
SQLite): three workers, one run per slot; the leader killed with SIGKILL between two slots is
replaced, and the new leader goes on. No slot fires twice, only the leader fires, and every
fire takes the latest slot due at its round, so the slots lost while nobody led are not
replayed (the "latest missed slot fires once" rule) and no other slot is lost."""

from __future__ import annotations

import json
import signal
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from tasks_engine.models import WorkflowRun
from tasks_engine.schedules import Cron
from tasks_engine.services.leader import current_leader
from tests.helpers import SHORT_PERIODS, WorkerProcess, wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

CRON = Cron("*/2 * * * * *", "UTC")
ENV = {
    "DJANGO_SETTINGS_MODULE": "tests.schedule_settings",
    "TEST_SCHEDULES": json.dumps({"tick": {"task": "repeat_names", "cron": CRON.expr}}),
}
PREFIX = "schedule:tick:"


def run_slots() -> list[datetime]:
    """The slots that have a run, each checked to have exactly one."""
    keys = WorkflowRun.objects.filter(idempotency_key__startswith=PREFIX).values_list(
        "idempotency_key", flat=True
    )
    counts = Counter(keys)
    assert set(counts.values()) <= {1}, counts
    return sorted(datetime.fromisoformat(k.removeprefix(PREFIX)) for k in counts)


def fires(w: WorkerProcess) -> list[dict[str, Any]]:
    """The worker's `schedule_fired` log events (JSON lines, written once the fire
    committed; a SIGKILL may cut the last line short)."""
    found = []
    for line in w.log().splitlines():
        if line.startswith("{") and '"schedule_fired"' in line:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "schedule_fired":
                found.append(event)
    return found


@pytest.mark.one_db("the latest-missed-slot rule")
def test_one_run_per_slot_across_a_leader_killed_between_two_slots(workers) -> None:
    env = {**ENV, **SHORT_PERIODS}  # the killed leader's lease runs out sooner
    procs = [workers("--poll-interval", "0.2", env=env, tag=f"w{i}") for i in range(3)]
    by_pid = {w.pid: w for w in procs}
    first = wait_for(current_leader, 60, "a leader")
    old = by_pid[int(first.worker_id.split(":")[1])]
    wait_for(lambda: len(fires(old)) >= 3, 60, "three fires by the first leader")
    # Between two slots: right after a fire, long before the next slot is due.
    seen = len(fires(old))
    wait_for(lambda: len(fires(old)) > seen, 60, "one more fire to kill the leader after")
    old.send(signal.SIGKILL)
    old.wait(10)
    second = wait_for(
        lambda: (lease := current_leader()) is not None and lease.term > first.term and lease,
        60,
        "a new leader",
    )
    new = by_pid[int(second.worker_id.split(":")[1])]
    assert new is not old
    wait_for(lambda: len(fires(new)) >= 3, 60, "three fires by the new leader")
    for w in procs:  # freeze the record: no more fires while it is read
        w.send(signal.SIGKILL)
        w.wait(10)

    events = sorted((e for w in procs for e in fires(w)), key=lambda e: e["at"])
    # Each fire made a run of its own (none came back deduplicated), one run per slot, and
    # the slots only ever go forward: none fired twice, none fired late.
    assert not [e for e in events if e["deduplicated"]]
    slots = [datetime.fromisoformat(e["slot"]) for e in events]
    assert slots == sorted(set(slots))
    # A run can exist without its line only for a fire committed just as its process was
    # killed: the slot after that process's last logged one.
    unlogged = set(run_slots()) - set(slots)
    last = {CRON.next_after(datetime.fromisoformat(fires(w)[-1]["slot"])) for w in (old, new)}
    assert set(slots) <= set(run_slots()) and unlogged <= last, unlogged
    # Only one process fired at a time: the first leader, then the new one.
    spans = [(fires(w)[0]["at"], fires(w)[-1]["at"]) for w in (old, new)]
    assert spans[0][1] < spans[1][0]
    assert sum(len(fires(w)) for w in procs) == sum(len(fires(w)) for w in (old, new))
    # Each fire took the latest slot due at its round: nothing before it was left to fire
    # later, and whatever was skipped (the slots while nobody led) is not replayed.
    for e in events:
        slot, at = datetime.fromisoformat(e["slot"]), datetime.fromisoformat(e["at"])
        following = CRON.next_after(slot)
        assert following is not None and slot <= at < following, e


ROUNDS = """
import time
from tasks_engine import schedules
end = time.monotonic() + 6
while time.monotonic() < end:
    schedules.run_once()
"""


@pytest.mark.both_dbs  # the state row's lock: BEGIN IMMEDIATE on SQLite
def test_two_processes_running_rounds_at_once_fire_each_slot_once(tmp_path) -> None:
    """Not through the leader: two processes call run_once() back to back for a few seconds
    on an every-second schedule; the state row's lock (BEGIN IMMEDIATE on SQLite) lets one
    fire each slot and the other find it fired."""
    env = {
        **ENV,
        "TEST_SCHEDULES": json.dumps({"sec": {"task": "repeat_names", "cron": "* * * * * *"}}),
    }
    procs = [WorkerProcess(["shell", "-c", ROUNDS], tmp_path, f"r{i}", env) for i in range(2)]
    try:
        codes = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            p.stop()
    assert codes == [0, 0], [p.log() for p in procs]
    events = [e for p in procs for e in fires(p)]
    keys = [
        str(k)
        for k in WorkflowRun.objects.filter(
            idempotency_key__startswith="schedule:sec:"
        ).values_list("idempotency_key", flat=True)
    ]
    assert len(keys) >= 3  # (the rounds ran for a few seconds)
    assert sorted(f"schedule:sec:{e['slot']}" for e in events) == sorted(keys)
    assert not [e for e in events if e["deduplicated"]]
