"""`runworker --processes N`: real supervisor and worker processes, on PostgreSQL and SQLite."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from django.db import connection

import tasks_engine
from tasks_engine.models import Worker as WorkerRow
from tasks_engine.models import WorkflowRun
from tests.helpers import wait_for

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
    sup = workers("--processes", "2", "--poll-interval", "0.2", tag="sup")
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
    sup = workers("--processes", "2", "--burst", "--poll-interval", "0.2", tag="burst")
    assert sup.wait(120) == 0, sup.log()
    assert WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 20
    if connection.vendor == "sqlite":  # the supervisor warns once for all of its children
        assert sup.log().count("(tasks_engine.W024)") == 1, sup.log()
        assert "(tasks_engine.W025)" not in sup.log()  # nor does a child about its siblings
