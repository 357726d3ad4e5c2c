"""Flow control across three real worker processes: the running runs of a limited queue and of
one key never exceed their limits (from the start/end records the runs write), keys run side
by side, and a queue's rate limit holds fleet-wide."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.testapp.process_workflows import trace_lines

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # flow claims: separate statements on SQLite
]

QUEUES = {"flow-io": {"concurrency": 2}, "flow-rate": {"rate_limit": "2/s"}}
ARGS = ("--concurrency", "4", "--poll-interval", "0.1", "--burst")


def most_at_once(records: list[dict[str, Any]], group: str) -> dict[str, int]:
    """The highest number of runs of each `group` value between their start and end."""
    events = sorted(records, key=lambda r: (r["at"], r["event"] == "start"))  # ends first
    now: dict[str, int] = {}
    most: dict[str, int] = {}
    for r in events:
        g = r[group]
        now[g] = now.get(g, 0) + (1 if r["event"] == "start" else -1)
        most[g] = max(most.get(g, 0), now[g])
    return most


def start_three(workers: Any) -> list[Any]:
    env = {"TEST_TASKS_QUEUES": json.dumps(QUEUES)}
    return [workers(*ARGS, env=env, tag=f"w{i}") for i in range(3)]


def finish_all(procs: list[Any]) -> None:
    for p in procs:
        assert p.wait(120) == 0, p.log()
    assert WorkflowRun.objects.exclude(status="completed").count() == 0


def test_queue_and_key_limits_hold_across_three_workers(workers: Any, tmp_path: Path) -> None:
    trace = str(tmp_path / "trace")
    for disk in ("a", "a", "a", "b", "b", "b"):
        tasks_engine.enqueue("flow-disk", {"disk": disk, "seconds": 0.2, "trace": trace})
    for _ in range(3):
        tasks_engine.enqueue("flow-pair", {"disk": "pair", "seconds": 0.2, "trace": trace})
    for _ in range(8):
        tasks_engine.enqueue("flow-plain", {"disk": "io", "seconds": 0.2, "trace": trace})
    finish_all(start_three(workers))
    records = trace_lines(trace)
    assert len(records) == 2 * 17
    by_key = most_at_once(records, "key")
    assert by_key["a"] == 1 and by_key["b"] == 1  # limit 1 (a run's own key: "disk:<disk>")
    assert by_key["pair"] <= 2
    assert most_at_once(records, "q")["flow-io"] <= 2


def test_keys_run_side_by_side(workers: Any, tmp_path: Path) -> None:
    # a's run ends only once b's run has started: with the keys serialised against each other
    # (or a key blocking a worker) it would never end.
    b_started = str(tmp_path / "b-started")
    tasks_engine.enqueue("flow-disk", {"disk": "a", "await_path": b_started})
    tasks_engine.enqueue("flow-disk", {"disk": "b", "touch": b_started, "seconds": 0.2})
    finish_all(start_three(workers))


def test_rate_limit_holds_across_workers(workers: Any) -> None:
    for _ in range(7):
        tasks_engine.enqueue("flow-rated", {})
    finish_all(start_three(workers))
    starts = sorted(t for t in WorkflowRun.objects.values_list("started_at", flat=True) if t)
    # 2/s: any three claims span at least a second (the claims' own clock, as the log records)
    for first, third in zip(starts, starts[2:], strict=False):
        assert (third - first).total_seconds() >= 1.0, starts


def test_worker_concurrency_caps_each_worker_not_the_fleet(workers: Any, tmp_path: Path) -> None:
    """A queue's worker_concurrency of 1 with three workers of --concurrency 4: never more
    than one of its runs at once in any worker, and the workers run them side by side (a
    fleet-wide reading of the cap would never reach two at once)."""
    trace = str(tmp_path / "trace")
    for _ in range(9):
        tasks_engine.enqueue("flow-plain", {"disk": "io", "seconds": 0.3, "trace": trace})
    env = {"TEST_TASKS_QUEUES": json.dumps({"flow-io": {"worker_concurrency": 1}})}
    procs = [workers(*ARGS, env=env, tag=f"w{i}") for i in range(3)]
    finish_all(procs)
    records = trace_lines(trace)
    assert len(records) == 2 * 9
    per_worker = most_at_once([{**r, "w": str(r["pid"])} for r in records], "w")
    assert set(per_worker.values()) == {1}, per_worker
    assert len(per_worker) >= 2 and most_at_once(records, "q")["flow-io"] >= 2, per_worker
