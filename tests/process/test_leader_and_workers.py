"""Real `runworker` processes, on PostgreSQL and SQLite: worker rows, the dead-worker service,
and the maintenance leader (one at a time; a killed one replaced)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import LeaderLease, WorkflowRun
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.services.leader import ROLE, current_leader
from tests.helpers import ROOT, SHORT_PERIODS, WorkerProcess, database_url, wait_for
from tests.testapp.leader_probe import probed_pids
from tests.testapp.models import Marker, SideEffect

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

FAST = ("--poll-interval", "0.2")


def row_of(pid: int) -> WorkerRow | None:
    return WorkerRow.objects.filter(pid=pid).first()


def tasks_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.one_db("worker rows")
def test_a_worker_row_appears_beats_and_goes_on_graceful_stop(workers) -> None:
    w = workers(*FAST, "--queue", "default", "--concurrency", "2")
    first = wait_for(lambda: row_of(w.pid), 30, "the worker's row")
    assert (first.queues, first.concurrency) == (["default"], 2)
    assert "noop@1" in first.tasks and first.id.split(":")[1] == str(w.pid)
    wait_for(
        lambda: WorkerRow.objects.get(pk=first.id).last_heartbeat > first.last_heartbeat,
        30,
        "a later beat",
    )
    assert WorkerRow.objects.filter(pid=w.pid).count() == 1
    w.send(signal.SIGTERM)
    assert w.wait(30) == 0, w.log()
    assert not WorkerRow.objects.filter(pk=first.id).exists()


@pytest.mark.one_db("the command's output")
def test_tasks_workers_json_lists_live_workers_their_runs_and_the_leader(workers) -> None:
    res = tasks_engine.enqueue("slow_middle", {"seconds": 30})
    w = workers(*FAST)
    wait_for(lambda: SideEffect.objects.filter(key="middle-start").exists(), 30, "the step")
    wait_for(lambda: current_leader() is not None, 30, "a leader")
    out = tasks_cli("workers", "--json")
    assert out.returncode == 0, out.stderr
    [view] = json.loads(out.stdout)
    assert (view["pid"], view["alive"], view["leader"]) == (w.pid, True, True)
    assert view["runs"] == [str(res.run_id)]
    assert set(view) >= {"id", "host", "queues", "tasks", "concurrency", "started_at"}
    assert set(view) >= {"last_heartbeat", "runs_held"}
    text = tasks_cli("workers")
    assert text.returncode == 0 and view["id"] in text.stdout and "leader" in text.stdout


@pytest.mark.one_db("the dead-worker service's rule")
def test_a_killed_worker_costs_seconds_not_its_120s_lease(workers) -> None:
    res = tasks_engine.enqueue("slow_middle", {"seconds": 3})
    doomed = workers("--lease-seconds", "120", *FAST, tag="doomed", env=SHORT_PERIODS)
    wait_for(lambda: SideEffect.objects.filter(key="middle-start").exists(), 30, "the step")
    lease_ends = WorkflowRun.objects.get(pk=res.run_id).available_at
    doomed.send(signal.SIGKILL)
    doomed.wait(10)
    rescuer = workers("--lease-seconds", "120", *FAST, tag="rescuer", env=SHORT_PERIODS)
    wait_for(
        lambda: SideEffect.objects.filter(key="middle-start").count() == 2,
        90,
        "the rescuer to retake the run",
    )
    retaken = WorkflowRun.objects.get(pk=res.run_id)
    assert retaken.worker_id.split(":")[1] == str(rescuer.pid)
    assert retaken.started_at < lease_ends  # (sanity)
    assert SideEffect.objects.get(key="middle-start", worker="rescuer").created_at < lease_ends
    wait_for(lambda: WorkflowRun.objects.get(pk=res.run_id).status == "completed", 60, "the end")
    assert not WorkerRow.objects.filter(pid=doomed.pid).exists()  # reaped


def write_lock_free() -> bool:
    """SQLite: whether a write could start now (BEGIN IMMEDIATE within half a second), from a
    connection of its own. Always true on PostgreSQL, which has no database-wide lock."""
    if connection.vendor != "sqlite":
        return True
    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.5, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


def stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (kill returns before the signal is delivered)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.exists():
        return True  # not Linux: take the signal as delivered
    states = []
    for task in tasks.iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return all(state in "Tt" for state in states)


def freeze(w: WorkerProcess) -> None:
    """SIGSTOP `w` at a moment it holds no SQLite write lock. Stopped inside one of its short
    write transactions (a claim, a beat, the leader's rounds), it would hold the database's only
    write lock for as long as it is stopped, and every other process's writes would wait for it
    (docs/SQLITE.md, "One writer"); a rescuer then cannot even start (Django's JSON probe, run in
    a transaction, times out and the system check reports "SQLite does not support
    JSONFields"). That is SQLite, not the dead-worker service under test."""
    for _ in range(20):
        w.send(signal.SIGSTOP)
        wait_for(lambda: stopped(w.pid), 5, "the worker to stop")
        if write_lock_free():
            return
        w.send(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("the worker held the write lock at every SIGSTOP")


@pytest.mark.both_dbs  # SQLite's write lock, the fenced commit
def test_a_stalled_worker_declared_dead_commits_nothing_and_comes_back(workers) -> None:
    """The dead-worker service cannot tell a stalled worker (SIGSTOP, a long GC pause, a
    suspended VM) from a dead one: it releases the runs of a worker whose beat is old. When the
    stalled worker wakes up, its commit is fenced (the run is another worker's now), it stays
    up, its row comes back with its next beat, and it serves new runs."""
    run_id = tasks_engine.enqueue("fenced_slow", {"seconds": 3}).run_id
    frozen = workers("--lease-seconds", "120", *FAST, tag="frozen", env=SHORT_PERIODS)
    wait_for(lambda: SideEffect.objects.filter(key="op-start").exists(), 30, "the op to start")
    freeze(frozen)
    try:
        rescuer = workers("--lease-seconds", "120", *FAST, tag="rescuer", env=SHORT_PERIODS)
        wait_for(
            lambda: WorkflowRun.objects.get(pk=run_id).status == "completed",
            90,
            "the rescuer to retake the run (the frozen worker's 120 s lease notwithstanding)",
        )
        assert row_of(frozen.pid) is None  # declared dead, its row reaped
    finally:
        frozen.send(signal.SIGCONT)
    wait_for(
        lambda: "dropping the run" in frozen.log(),
        5,
        "the woken worker's op to end and its commit to be refused",
    )
    assert list(Marker.objects.values_list("value", flat=True)) == ["rescuer"]
    assert WorkflowRun.objects.get(pk=run_id).worker_id.split(":")[1] == str(rescuer.pid)
    log = frozen.log()
    assert "FencingError" in log or "lease lost" in log, log
    assert frozen.proc.poll() is None, log  # it did not crash
    wait_for(lambda: row_of(frozen.pid) is not None, 30, "the woken worker's row to come back")
    rescuer.send(signal.SIGTERM)
    rescuer.wait(30)
    other = tasks_engine.enqueue("b").run_id
    wait_for(
        lambda: WorkflowRun.objects.get(pk=other).status == "completed",
        30,
        "the woken worker to serve a new run",
    )
    assert WorkflowRun.objects.get(pk=other).worker_id.split(":")[1] == str(frozen.pid)


@pytest.mark.both_dbs  # the leader's lease on the database's clock
def test_exactly_one_leader_among_three_and_a_killed_one_is_replaced(
    workers, tmp_path: Path
) -> None:
    probe = str(tmp_path / "probe")
    env = {"LEADER_PROBE": probe, **SHORT_PERIODS}
    procs = [workers(*FAST, env=env, tag=f"w{i}") for i in range(3)]
    by_pid = {p.pid: p for p in procs}
    wait_for(lambda: WorkerRow.objects.count() == 3, 30, "three worker rows")
    wait_for(lambda: len(probed_pids(probe)) >= 10, 60, "ten rounds of the probe service")
    first = current_leader()
    assert first is not None
    leader_pid = int(first.worker_id.split(":")[1])
    assert set(probed_pids(probe)) == {leader_pid}  # only the leader ran the service
    elected = [p for p in procs if "elected maintenance leader" in p.log()]
    assert [p.pid for p in elected] == [leader_pid]

    by_pid[leader_pid].send(signal.SIGKILL)
    by_pid[leader_pid].wait(10)
    rounds = len(probed_pids(probe))
    second = wait_for(
        lambda: (
            (lease := current_leader()) is not None and lease.worker_id != first.worker_id and lease
        ),
        30,
        "a new leader",
    )
    assert second.term > first.term
    new_pid = int(second.worker_id.split(":")[1])
    wait_for(lambda: new_pid in probed_pids(probe)[rounds:], 30, "the new leader's rounds")
    assert set(probed_pids(probe)[rounds:]) == {new_pid}
    # The killed leader's row goes too (the new leader's dead-worker service reaps it).
    wait_for(lambda: row_of(leader_pid) is None, 60, "the dead leader's row to be reaped")


@pytest.mark.both_dbs  # the leader's lease on the database's clock
def test_a_leader_that_stops_gracefully_hands_over_at_once(workers, tmp_path: Path) -> None:
    a = workers(*FAST, tag="a")
    first = wait_for(current_leader, 30, "a leader")
    b = workers(*FAST, tag="b")
    wait_for(lambda: WorkerRow.objects.count() == 2, 30, "both rows")
    a.send(signal.SIGTERM)
    assert a.wait(30) == 0, a.log()
    # Resigned: the lease expired at once instead of running out.
    row = LeaderLease.objects.get(name=ROLE)
    assert row.term > first.term or row.expires_at <= first.expires_at
    second = wait_for(current_leader, 30, "b to lead")
    assert second.worker_id.split(":")[1] == str(b.pid) and second.term == first.term + 1
