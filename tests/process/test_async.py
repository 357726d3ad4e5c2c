"""`async def` workflows in real worker processes, on both databases: every kind of step,
SIGKILL and replay, and the aborts (cancel, step timeout, deadline, lost lease) reaching an
awaiting step as asyncio.CancelledError. The thousand-run check of one event loop per worker
is at the end (threads counted from /proc)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

import tasks_engine
from tasks_engine import clock
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import wait_for
from tests.testapp.models import Marker, SideEffect
from tests.testapp.process_workflows import trace_lines

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

FAST = ("--concurrency", "4", "--lease-seconds", "2", "--poll-interval", "0.2")


def status(run_id) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def trace(tmp_path: Path, run_id) -> list[tuple[str, str]]:
    return [(r["step"], r["event"]) for r in trace_lines(tmp_path / f"{run_id}.jsonl")]


def reasons(tmp_path: Path, run_id) -> list[str]:
    lines = trace_lines(tmp_path / f"{run_id}.jsonl")
    return [r["reason"] for r in lines if r["event"] == "cancelled"]


def test_async_steps_run_on_the_workers_loop_and_plain_ones_in_threads(workers) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue("async_basic", {"pause": 0.1, "sleep": 0.3})
    wait_for(lambda: status(res.run_id) in ("completed", "failed"), 30, "the run to end")
    run = tasks_engine.get_run(res.run_id)
    assert run.status == "completed", run.error
    assert run.output["lookup"]["loop"] == "tasks-async-loop"
    assert run.output["plain"]["thread"].startswith("tasks-step")
    assert run.output["twice"] == 42
    assert SideEffect.objects.filter(run_id=res.run_id).count() == 1


def test_sleep_fact_child_atomic_fenced_and_patched_in_a_worker(workers) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue("async_full", {"sleep": 0.3})
    wait_for(lambda: status(res.run_id) == "waiting", 30, "the fact wait")
    tasks_engine.signal(res.run_id, "approved", {"ok": True})
    wait_for(lambda: status(res.run_id) in ("completed", "failed"), 30, "the run to end")
    run = tasks_engine.get_run(res.run_id)
    assert run.status == "completed", run.error
    assert run.output == {
        "fact": {"ok": True},
        "child": {"child": True},
        "atomic": "written",
        "op": {"resumed": False},
        "patched": True,
    }
    assert Marker.objects.filter(key__endswith=str(res.run_id)).count() == 2


def test_sigkill_mid_step_replays_without_rerunning_finished_steps(workers, tmp_path) -> None:
    w = workers(*FAST)
    res = tasks_engine.enqueue("async_killable", {"trace": str(tmp_path), "seconds": 3})
    wait_for(lambda: ("slow", "start") in trace(tmp_path, res.run_id), 30, "the slow step")
    time.sleep(0.8)  # the quick step's deferred completion is flushed within 0.5 s
    w.send(signal.SIGKILL)
    w.wait(10)
    workers(*FAST, tag="second")
    wait_for(lambda: status(res.run_id) == "completed", 40, "the replay to complete")
    assert trace(tmp_path, res.run_id).count(("quick", "start")) == 1
    assert trace(tmp_path, res.run_id).count(("slow", "start")) == 2
    assert tasks_engine.get_run(res.run_id).output == {"quick": 1, "slow": 2}
    slow = StepAttempt.objects.filter(run_id=res.run_id, name="slow").order_by("id")
    assert [a.status for a in slow] == ["abandoned", "completed"]


def test_a_cancel_reaches_an_awaiting_step_as_cancelled_error(workers, tmp_path) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue("async_blocker", {"trace": str(tmp_path)})
    wait_for(lambda: ("block", "start") in trace(tmp_path, res.run_id), 30, "the step")
    tasks_engine.cancel(res.run_id, reason="no longer wanted")
    wait_for(lambda: status(res.run_id) == "canceled", 20, "the cancel")  # not the 60 s step
    assert reasons(tmp_path, res.run_id) == ["TaskCanceledError"]
    [step] = StepAttempt.objects.filter(run_id=res.run_id)
    assert step.status != "completed"


def test_a_step_timeout_cancels_the_awaiting_step_and_retries_it(workers, tmp_path) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue(
        "async_blocker", {"trace": str(tmp_path), "timeout": 0.5, "max_attempts": 2}
    )
    wait_for(lambda: status(res.run_id) == "failed", 30, "the run to fail")
    assert reasons(tmp_path, res.run_id) == ["StepTimeoutError", "StepTimeoutError"]
    attempts = StepAttempt.objects.filter(run_id=res.run_id).order_by("id")
    assert [(a.status, a.error["type"]) for a in attempts] == [
        ("failed", "tasks_engine.exceptions.StepTimeoutError"),
        ("failed", "tasks_engine.exceptions.StepTimeoutError"),
    ]
    assert WorkflowRun.objects.get(pk=res.run_id).error["type"].endswith("StepTimeoutError")


def test_a_deadline_cancels_the_awaiting_step_and_fails_the_run(workers, tmp_path) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue(
        "async_blocker", {"trace": str(tmp_path)}, deadline_at=clock.now() + timedelta(days=1)
    )
    wait_for(lambda: ("block", "start") in trace(tmp_path, res.run_id), 30, "the step")
    # The deadline passes while the step awaits (brought forward: no wait for a real one).
    WorkflowRun.objects.filter(pk=res.run_id).update(deadline_at=clock.now())
    wait_for(lambda: status(res.run_id) == "failed", 20, "the deadline")
    assert reasons(tmp_path, res.run_id) == ["DeadlineExceededError"]
    assert WorkflowRun.objects.get(pk=res.run_id).error["type"].endswith("DeadlineExceededError")


def test_a_lost_lease_cancels_the_awaiting_step(workers, tmp_path) -> None:
    """Another attempt takes the run over (its lease token changes under the worker): the
    heartbeat finds the lease lost and cancels the step; the run is not written by it."""
    workers(*FAST)
    res = tasks_engine.enqueue("async_blocker", {"trace": str(tmp_path)})
    wait_for(lambda: ("block", "start") in trace(tmp_path, res.run_id), 30, "the step")
    WorkflowRun.objects.filter(pk=res.run_id).update(lease_token=uuid.uuid4(), worker_id="other")
    wait_for(lambda: reasons(tmp_path, res.run_id), 15, "the step to be cancelled")
    assert reasons(tmp_path, res.run_id) == ["LeaseLostError"]
    assert WorkflowRun.objects.get(pk=res.run_id).worker_id == "other"  # not written by it


@pytest.mark.slow
def test_a_thousand_async_runs_awaiting_io_hold_no_thousand_threads(workers) -> None:
    """1,000 runs each awaiting 1 s, one worker at --concurrency 1000: at most 50 threads in
    the worker process (/proc/PID/task) while they run. The wall time is measured by
    bench/async_io.py (no timing threshold in a test)."""
    tasks_engine.enqueue_many("async_io", [{"seconds": 1.0} for _ in range(1000)])
    w = workers(
        *("--concurrency", "1000", "--task", "async_io@1", "--queue", "async-io"),
        *("--poll-interval", "0.2"),
    )
    most_threads = 0

    def all_done() -> bool:
        nonlocal most_threads
        most_threads = max(most_threads, len(os.listdir(f"/proc/{w.pid}/task")))
        pending = WorkflowRun.objects.filter(task_name="async_io").exclude(status="completed")
        return not pending.exists()

    wait_for(all_done, 120, "the thousand runs")
    runs = list(WorkflowRun.objects.filter(task_name="async_io"))
    ends = [r.finished_at for r in runs if r.finished_at is not None]
    wall = max(ends) - min(r.started_at for r in runs if r.started_at is not None)
    print(f"1000 async runs: {wall.total_seconds():.2f} s wall, at most {most_threads} threads")
    assert most_threads <= 50, most_threads
    in_flight = max(r.output["threads"] for r in WorkflowRun.objects.filter(task_name="async_io"))
    assert in_flight <= 50, in_flight


def test_an_async_view_enqueues_and_awaits_a_run(workers) -> None:
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient, override_settings

    workers(*FAST)
    with override_settings(ROOT_URLCONF="tests.testapp.urls"):
        response = async_to_sync(AsyncClient().get)("/fetch-meta/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "completed"
    assert body["output"]["twice"] == 42
    assert status(body["run_id"]) == "completed"


def test_sigterm_hands_an_awaiting_async_run_back(workers, tmp_path) -> None:
    """A graceful stop: past the grace, the awaiting step is cancelled with WorkerStopping,
    the run goes back to pending at once (not counted), and the worker exits 0."""
    w = workers(*FAST, "--grace-seconds", "1")
    res = tasks_engine.enqueue("async_blocker", {"trace": str(tmp_path)})
    wait_for(lambda: ("block", "start") in trace(tmp_path, res.run_id), 30, "the step")
    w.send(signal.SIGTERM)
    assert w.wait(30) == 0
    assert reasons(tmp_path, res.run_id) == ["WorkerStopping"]
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.failures) == ("pending", 0)


def test_an_async_step_that_swallows_its_cancel_is_written_off_and_frees_its_place(
    workers, tmp_path
) -> None:
    """--concurrency 1: the canceled run ends canceled after the grace (a lease) although
    its step goes on awaiting, and its place goes to the next run at once."""
    workers("--concurrency", "1", "--lease-seconds", "2", "--poll-interval", "0.2")
    stuck = tasks_engine.enqueue(
        "async_blocker", {"trace": str(tmp_path), "ignores": True, "seconds": 60}
    )
    wait_for(lambda: ("block", "start") in trace(tmp_path, stuck.run_id), 30, "the step")
    after = tasks_engine.enqueue("async_basic", {})
    tasks_engine.cancel(stuck.run_id, reason="stop")
    wait_for(lambda: status(stuck.run_id) == "canceled", 30, "the write-off")
    wait_for(lambda: status(after.run_id) == "completed", 30, "the next run")
    assert reasons(tmp_path, stuck.run_id) == ["TaskCanceledError"]
    assert ("block", "ignored") not in trace(tmp_path, stuck.run_id)  # still awaiting
