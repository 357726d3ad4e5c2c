"""Queues at runtime across three real worker processes (both databases): no run of a paused
queue is claimed once the pause has committed plus one poll interval; a pause survives
restarting every worker; a resume wakes idle workers at once (PostgreSQL, NOTIFY); a
concurrency lowered from 4 to 1 with 4 running admits no run until the running ones are down
to none, and a raised one reaches the workers."""

from __future__ import annotations

import functools
import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tasks_engine
from tasks_engine.models import WorkflowRun
from tests.helpers import wait_for
from tests.testapp.process_workflows import trace_lines

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.both_dbs]

POLL = 0.2


def start_three(workers: Any, *extra: str, env: dict[str, str] | None = None) -> list[Any]:
    args = ("--concurrency", "4", "--poll-interval", str(POLL), *extra)
    return [workers(*args, env=env or {}, tag=f"w{i}-{time.monotonic_ns()}") for i in range(3)]


def count(queue: str, status: str) -> int:
    return WorkflowRun.objects.filter(queue=queue, status=status).count()


def stop(procs: list[Any]) -> None:
    """SIGTERM once each has started (a process still importing Django has no handler)."""
    wait_for(lambda: all("worker started" in p.log() for p in procs), 60, "workers started")
    for p in procs:
        p.send(signal.SIGTERM)
    for p in procs:
        assert p.wait(60) == 0, p.log()


def test_no_run_of_a_paused_queue_is_claimed_after_the_pause_plus_one_poll(workers: Any) -> None:
    for _ in range(400):
        tasks_engine.enqueue("flow-plain", {"seconds": 0.02}, queue="racing")
    procs = start_three(workers)
    wait_for(lambda: count("racing", "completed") >= 30, 60, "the workers to be claiming")
    tasks_engine.pause_queue("racing", reason="race test")
    committed = datetime.now(UTC)
    time.sleep(10 * POLL)
    late = WorkflowRun.objects.filter(
        queue="racing", started_at__gt=committed + timedelta(seconds=POLL)
    )
    assert [
        (t - committed).total_seconds() for t in late.values_list("started_at", flat=True)
    ] == []
    assert count("racing", "pending") > 0  # the workers had more to claim
    tasks_engine.resume_queue("racing")
    wait_for(lambda: count("racing", "completed") == 400, 120, "every run after the resume")
    stop(procs)


def done(runs: list[Any]) -> bool:
    return WorkflowRun.objects.filter(pk__in=runs, status="completed").count() == len(runs)


def test_a_pause_survives_restarting_every_worker(workers: Any) -> None:
    tasks_engine.pause_queue("held")
    held = [tasks_engine.enqueue("b", {}, queue="held").run_id for _ in range(3)]
    for generation in range(2):
        marker = [tasks_engine.enqueue("b", {}, queue="free").run_id for _ in range(3)]
        procs = start_three(workers)
        wait_for(functools.partial(done, marker), 60, f"generation {generation}: free queue")
        time.sleep(3 * POLL)
        assert WorkflowRun.objects.filter(pk__in=held, status="pending").count() == 3
        stop(procs)
    procs = start_three(workers)
    tasks_engine.resume_queue("held")
    wait_for(
        lambda: WorkflowRun.objects.filter(pk__in=held, status="completed").count() == 3,
        60,
        "the held runs after the resume",
    )
    stop(procs)


@pytest.mark.postgres_only("the resume's NOTIFY")
def test_a_resume_wakes_idle_workers_at_once(workers: Any) -> None:
    """Workers polling every 30 s (a snapshot read every 15 s) claim the resumed queue's run
    long before either: the resume's NOTIFY makes them read the queue table and claim."""
    tasks_engine.pause_queue("held")
    run = tasks_engine.enqueue("b", {}, queue="held").run_id
    procs = [workers("--poll-interval", "30", tag=f"idle{i}") for i in range(3)]
    wait_for(lambda: all("listening for wake-ups" in p.log() for p in procs), 60, "LISTEN")
    time.sleep(1.0)
    assert WorkflowRun.objects.get(pk=run).status == "pending"
    tasks_engine.resume_queue("held")
    wait_for(lambda: WorkflowRun.objects.get(pk=run).status == "completed", 10, "the wake-up")
    stop(procs)


def started(trace: str) -> list[dict[str, Any]]:
    return [r for r in trace_lines(trace) if r["event"] == "start"]


def ended(trace: str) -> set[str]:
    return {r["run"] for r in trace_lines(trace) if r["event"] == "end"}


def release(run_ids: list[str]) -> None:
    for run_id in run_ids:
        Path(WorkflowRun.objects.get(pk=run_id).input["await_path"]).touch()


def test_a_lowered_concurrency_never_over_admits_and_a_raised_one_reaches_the_workers(
    workers: Any, tmp_path: Path
) -> None:
    trace = str(tmp_path / "trace")
    for i in range(9):
        tasks_engine.enqueue(
            "flow-plain", {"trace": trace, "await_path": str(tmp_path / f"release-{i}")}
        )
    env = {"TEST_TASKS_QUEUES": json.dumps({"flow-io": {"concurrency": 4}})}
    procs = start_three(workers, env=env)
    wait_for(lambda: len(started(trace)) == 4, 60, "four runs of the queue")
    first = [r["run"] for r in started(trace)]
    tasks_engine.set_queue_limits("flow-io", concurrency=1)
    time.sleep(POLL)  # one poll interval: every worker has it
    release(first[:1])
    wait_for(lambda: first[0] in ended(trace), 60, "the first run to end")
    time.sleep(5 * POLL)
    assert len(started(trace)) == 4  # 3 still running, limit 1: nothing admitted
    release(first[1:])
    wait_for(lambda: len(started(trace)) == 5, 60, "one run once none is running")
    time.sleep(5 * POLL)
    assert len(started(trace)) == 5 and count("flow-io", "running") == 1
    tasks_engine.set_queue_limits("flow-io", concurrency=3)
    wait_for(lambda: len(started(trace)) == 7, 60, "the raised limit to reach the workers")
    time.sleep(5 * POLL)
    assert len(started(trace)) == 7 and count("flow-io", "running") == 3
    for i in range(9):
        (tmp_path / f"release-{i}").touch()
    wait_for(lambda: len(ended(trace)) == 9, 60, "every run")
    stop(procs)
