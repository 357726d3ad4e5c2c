"""Debounce, on_limit and per-key rate limits across three real worker processes, with
enqueues from four threads at once (docs/FLOW_CONTROL.md): a debounce key never has two runs
inside one window and its run starts with the last input; cancel_new and cancel_running never
let more than the key's limit run at once (from the start/end records the runs write); a
per-key rate limit never exceeds N claims in any window per key, while other keys run."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.engine.transitions.test_flow_race import in_threads
from tests.helpers import wait_for
from tests.process.test_flow import most_at_once
from tests.testapp.process_workflows import trace_lines

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.both_dbs,  # enqueue paths and the rate claim differ by dialect
]

ARGS = ("--concurrency", "4", "--poll-interval", "0.1")


def start_three(workers: Any) -> list[Any]:
    return [workers(*ARGS, tag=f"w{i}") for i in range(3)]


def all_finished(expected: int) -> bool:
    runs = WorkflowRun.objects
    return (
        runs.count() == expected and not runs.exclude(status__in=["completed", "canceled"]).exists()
    )


Call = tuple[float, float, int, Any]  # (began, ended, n, run id): one enqueue


def enqueue_from_four_threads(
    task: str, disks: list[str], per_thread: int, **job: Any
) -> list[Call]:
    calls: list[Call] = []
    lock = threading.Lock()
    counter = iter(range(1, 10**6))
    barrier = threading.Barrier(4, timeout=30)

    def enqueue(i: int) -> None:
        rng = random.Random(i)
        barrier.wait()
        for _ in range(per_thread):
            with lock:
                n = next(counter)
            began = time.time()
            got = tasks_engine.enqueue(task, {"disk": rng.choice(disks), "n": n, **job})
            with lock:
                calls.append((began, time.time(), n, got.run_id))
            time.sleep(rng.random() * 0.05)

    assert in_threads(enqueue, 4, 120, barrier) == []
    return calls


def test_debounce_makes_one_run_per_window_with_the_last_input(
    workers: Any, tmp_path: Path
) -> None:
    trace = str(tmp_path / "trace")
    procs = start_three(workers)
    calls = enqueue_from_four_threads("flow-debounce", ["a", "b"], 30, trace=trace)
    runs = {r.pk: r for r in WorkflowRun.objects.all()}
    wait_for(lambda: all_finished(len(runs)), 60, "every debounced run to finish")
    del procs
    starts = {r["run"]: r for r in trace_lines(trace) if r["event"] == "start"}
    assert len(starts) == len(runs) and 2 <= len(runs) < len(calls)
    answered: dict[Any, list[tuple[float, float, int]]] = {}
    for began, ended, n, run_id in calls:
        answered.setdefault(run_id, []).append((began, ended, n))
    for disk in ("a", "b"):
        mine = sorted(
            (r for r in WorkflowRun.objects.filter(debounce_key=f"d:{disk}")),
            key=lambda r: r.started_at.timestamp() if r.started_at else math.inf,
        )
        for before, after in itertools.pairwise(mine):
            # Its window closed between its claim (started_at, before the claim's commit) and
            # its step's start (after it): no enqueue answered with it began after that, and
            # none answered with the next run had ended before it.
            closed = starts[str(before.pk)]["at"]
            assert all(b <= closed for b, _e, _n in answered[before.pk]), before.pk
            opened = before.started_at.timestamp()
            assert all(e >= opened for _b, e, _n in answered[after.pk]), after.pk
    for run_id, run in runs.items():
        n = starts[str(run_id)]["n"]
        assert n == run.input["n"]
        [ended] = [e for _b, e, m in answered[run_id] if m == n]
        later = [m for b, _e, m in answered[run_id] if b > ended]
        assert not later, f"run {run_id} started with input {n}, enqueued before {later}"


def test_cancel_strategies_never_let_more_than_the_limit_run(workers: Any, tmp_path: Path) -> None:
    trace = str(tmp_path / "trace")
    procs = start_three(workers)
    job = {"trace": trace, "seconds": 0.15}
    calls = enqueue_from_four_threads("flow-cancel-new", ["n1", "n2"], 15, **job)
    calls += enqueue_from_four_threads("flow-cancel-running", ["r1", "r2"], 15, **job)
    wait_for(lambda: all_finished(len(calls)), 90, "every run to finish or be canceled")
    del procs
    records = trace_lines(trace)
    ended = {r["run"] for r in records if r["event"] == "end"}
    runs = {str(r.pk): r for r in WorkflowRun.objects.all()}
    # A run canceled while its step ran may stop before its end record: its end is its finish.
    for r in [r for r in records if r["event"] == "start" and r["run"] not in ended]:
        finished = runs[r["run"]].finished_at
        assert finished is not None
        records.append({**r, "event": "end", "at": finished.timestamp()})
    by_key = most_at_once(records, "key")
    assert all(by_key[k] <= 1 for k in ("n1", "n2") if k in by_key), by_key
    assert all(by_key[k] <= 2 for k in ("r1", "r2") if k in by_key), by_key
    canceled = [r for r in runs.values() if r.status == "canceled"]
    assert any("cancel_new" in r.cancel_reason for r in canceled)
    assert any("cancel_running" in r.cancel_reason for r in canceled)


def test_a_rate_limit_per_key_holds_fleet_wide_while_other_keys_run(workers: Any) -> None:
    procs = start_three(workers)
    calls = enqueue_from_four_threads("flow-key-rate", ["a", "b", "c"], 4)
    wait_for(lambda: all_finished(len(calls)), 90, "every rate-keyed run to finish")
    del procs
    every: list[float] = []
    for key in ("a", "b", "c"):
        starts = sorted(
            r.started_at for r in WorkflowRun.objects.filter(rate_key=key) if r.started_at
        )
        every += [t.timestamp() for t in starts]
        # 2/s: any three claims of a key span at least a second (the claims' own clock)
        for first, third in zip(starts, starts[2:], strict=False):
            assert (third - first).total_seconds() >= 1.0, (key, starts)
    every.sort()
    # The keys are not throttled by each other: some second started more than one key's 2.
    assert any(b - a < 1.0 for a, b in zip(every, every[2:], strict=False)), every
