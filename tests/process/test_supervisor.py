"""`runworker --processes N`: real supervisor and worker processes, on PostgreSQL and SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.models import WorkflowRun
from tasks_engine.worker import bounds
from tests.helpers import ROOT, database_url, wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def children(parent: int) -> set[int]:
    """Live child processes of `parent` (Linux /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def rows_of(pids: set[int]) -> set[int]:
    return set(WorkerRow.objects.filter(pid__in=pids).values_list("pid", flat=True))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.one_db("the supervisor's restarts")
def test_two_children_a_killed_one_restarted_and_sigterm_stops_all(workers) -> None:
    sup = workers("--processes", "2", "--concurrency", "2", "--poll-interval", "0.2", tag="sup")
    first = wait_for(
        lambda: (kids := children(sup.pid)) and len(rows_of(kids)) == 2 and kids,
        60,
        "two worker processes with their rows",
    )
    assert len(first) == 2
    assert not WorkerRow.objects.filter(pid=sup.pid).exists()  # the supervisor claims nothing

    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    replaced = wait_for(
        lambda: (
            (kids := children(sup.pid))
            and len(kids) == 2
            and victim not in kids
            and len(rows_of(kids)) == 2
            and kids
        ),
        60,
        "the killed child to be replaced",
    )
    assert max(first) in replaced  # the other child went on

    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(10)]
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 10,
        60,
        "the children to run work",
    )
    sup.send(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.log()
    assert not any(alive(pid) for pid in replaced)
    assert not rows_of(replaced)  # each child stopped gracefully: its row is gone


@pytest.mark.both_dbs  # SQLite: a warning of its own
def test_a_burst_supervisor_exits_once_its_children_have_drained(workers) -> None:
    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(20)]
    sup = workers(
        "--processes", "2", "--concurrency", "2", "--burst", "--poll-interval", "0.2",
        tag="burst",
    )  # fmt: skip
    assert sup.wait(120) == 0, sup.log()
    assert WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 20
    if connection.vendor == "sqlite":  # the supervisor warns once for all of its children
        assert sup.log().count("(tasks_engine.W024)") == 1, sup.log()
        assert "(tasks_engine.W025)" not in sup.log()  # nor does a child about its siblings


def events(log: str, name: str) -> list[dict[str, Any]]:
    """The supervisor's and its children's JSON log lines whose event is `name`."""
    found = []
    for line in log.splitlines():
        if line.startswith("{"):
            with_event = json.loads(line)
            if with_event.get("event") == name:
                found.append(with_event)
    return found


def start_supervisor(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def refused_without_a_child(*args: str) -> str:
    """Run `runworker ARGS`, which must exit before it starts any child; its stderr. Should it
    fork instead, it is killed at once (its children get SIGTERM with it) and the test fails."""
    sup = start_supervisor(*args)
    try:
        forked = wait_for(
            lambda: sup.poll() is not None or children(sup.pid), 60, "the command to end"
        )
        assert forked is True, f"it started worker processes {sorted(forked)}"
    finally:
        if sup.poll() is None:
            os.kill(sup.pid, signal.SIGKILL)
            sup.wait(10)
    _out, err = sup.communicate(timeout=10)
    assert sup.returncode != 0
    return err


def test_processes_beyond_the_machine_is_a_usage_error_and_forks_nothing() -> None:
    err = refused_without_a_child("--processes", "10000", "--burst")
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "--processes 10000" in lines[0], err
    assert not WorkerRow.objects.exists()


def test_processes_beyond_the_databases_bound_is_a_usage_error() -> None:
    if connection.vendor == "postgresql":
        # Two processes pass the CPU bound of any machine; 2 x (500 slots + their side loops)
        # connections pass no ordinary max_connections.
        args, says = ["--processes", "2", "--concurrency", "500"], "max_connections"
    else:
        assert bounds.CPU_MULTIPLE * bounds.cpus() > bounds.SQLITE_MAX_PROCESSES  # not the CPUs
        args, says = ["--processes", str(bounds.SQLITE_MAX_PROCESSES + 1)], "on SQLite"
    err = refused_without_a_child(*args, "--burst")
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert says in lines[0] and f"--processes {args[1]}" in lines[0], err
    assert not WorkerRow.objects.exists()


@pytest.mark.postgres_only("the bound counts PostgreSQL sessions")
def test_workers_of_async_workflows_only_are_bounded_by_their_engine_threads() -> None:
    """A worker of async workflows only starts no slot thread (its runs are tasks on its loop,
    their statements on at most 16 engine threads): 2 x 500 in flight is within the bound,
    where 2 x 500 slots (test_processes_beyond_the_databases_bound_is_a_usage_error) is not."""
    sup = start_supervisor(
        *("--processes", "2", "--concurrency", "500", "--task", "async_io@1"),
        *("--queue", "async-io", "--poll-interval", "0.2", "--burst"),
    )
    try:
        out, err = sup.communicate(timeout=120)
    finally:
        if sup.poll() is None:
            os.kill(sup.pid, signal.SIGKILL)
            sup.wait(10)
    assert sup.returncode == 0, err
    assert len(events(out + err, "worker process started")) == 2, out + err


def test_sigterm_while_spawning_starts_no_further_child_and_stops_promptly(tmp_path: Path) -> None:
    n = 4  # within the bound on both databases with one slot each
    log = tmp_path / "sup.log"
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    with open(log, "wb") as out:
        sup = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", "--processes", str(n),
             "--concurrency", "1", "--poll-interval", "0.2"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    seen: set[int] = set()
    try:
        seen |= wait_for(lambda: children(sup.pid), 60, "the first worker process")
        os.kill(sup.pid, signal.SIGTERM)
        signalled = time.monotonic()
        while sup.poll() is None and time.monotonic() - signalled < 20:
            seen |= children(sup.pid)
            time.sleep(0.02)
        assert sup.poll() == 0, log.read_text()
    finally:
        if sup.poll() is None:
            os.kill(sup.pid, signal.SIGKILL)
            sup.wait(10)
    started = {e["pid"] for e in events(log.read_text(), "worker process started")}
    assert started == seen and len(started) < n, log.read_text()  # none after the signal
    assert not any(alive(pid) for pid in started)
    assert not rows_of(started)


def test_a_stopped_child_is_killed_and_replaced(workers) -> None:
    sup = workers(
        "--processes", "2", "--concurrency", "2", "--poll-interval", "0.2",
        tag="stopped", env={"TEST_DEAD_WORKER_SECONDS": "1", "TEST_SQLITE_TIMEOUT": "2"},
    )  # fmt: skip
    first = wait_for(
        lambda: (kids := children(sup.pid)) and len(rows_of(kids)) == 2 and kids,
        60,
        "two worker processes with their rows",
    )
    victim = min(first)
    os.kill(victim, signal.SIGSTOP)
    try:
        replaced = wait_for(
            lambda: (
                (kids := children(sup.pid))
                and len(kids) == 2
                and victim not in kids
                and len(rows_of(kids)) == 2
                and kids
            ),
            60,
            "the stopped child to be replaced",
        )
        assert not alive(victim)
        silent = [
            e for e in events(sup.log(), "worker process silent; killed") if e["pid"] == victim
        ]
        assert len(silent) == 1, sup.log()
        assert silent[0]["silent_seconds"] >= 3.0  # the least silence a child is allowed
    finally:
        if alive(victim):
            os.kill(victim, signal.SIGKILL)
    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(10)]
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 10,
        60,
        "the fleet to run work again",
    )
    sup.send(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.log()
    assert not rows_of(replaced)
    assert len(events(sup.log(), "worker process silent; killed")) == 1  # none while stopping


@pytest.mark.postgres_only("the connections of a worker process are PostgreSQL sessions")
def test_a_worker_process_holds_the_connections_the_bound_counts(workers) -> None:
    from tasks_engine.services.leader import current_leader
    from tasks_engine.worker.loop import connections_per_process

    def sessions() -> int:  # on the test database, but this test's own
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cur.fetchone()[0])

    expected = connections_per_process(3)
    w = workers("--concurrency", "3", "--poll-interval", "0.2", tag="conns")
    wait_for(lambda: rows_of({w.pid}), 60, "the worker's row")
    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(6)]  # slots, group writer
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 6,
        60,
        "the runs to complete",
    )
    wait_for(current_leader, 30, "the worker to lead")
    # The heartbeat's connection opens with its first periodic beat of the row (about 2 s in).
    wait_for(lambda: sessions() == expected, 30, f"{expected} sessions")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:  # and no more, past another beat of every thread
        assert sessions() == expected
        time.sleep(0.1)
