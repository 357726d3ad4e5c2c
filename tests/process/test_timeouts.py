"""Step timeouts, default deadlines, `ctx.patched` across a deploy and replay-check, with real
worker processes (the heartbeat fires the timers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import tasks_engine
from tasks_engine.models import StepAttempt, Worker, WorkflowRun
from tests.helpers import ROOT, database_url, wait_for
from tests.testapp.models import Marker, SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_db("the worker's timers and replay rules"),
]

FAST = ("--concurrency", "1", "--lease-seconds", "2", "--poll-interval", "0.2")
TIMEOUT = "tasks_engine.exceptions.StepTimeoutError"


def status(run_id) -> str:
    return WorkflowRun.objects.get(pk=run_id).status


def attempts(run_id) -> list[tuple[str, str, int, str | None]]:
    return list(
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("name", "status", "attempt", "error__type")
    )


GROUP_COMMIT = pytest.mark.parametrize("group_commit", ["true", "false"])


@GROUP_COMMIT
def test_a_step_watching_its_abort_signal_times_out_and_is_retried(
    workers, group_commit: str
) -> None:
    workers(*FAST, env={"TASKS_GROUP_COMMIT": group_commit})
    res = tasks_engine.enqueue("timed_step", {"timeout": 0.3, "hangs": 1})
    wait_for(lambda: status(res.run_id) == "completed", 30, "the run to complete")
    assert tasks_engine.get_run(res.run_id).output == {
        "slow": {"attempt": 2},
        "after": {"aborted": False},
    }
    assert attempts(res.run_id) == [
        ("slow", "failed", 1, TIMEOUT),
        ("slow", "completed", 2, None),
        ("after", "completed", 1, None),
    ]


def test_timeouts_past_the_retry_budget_raise_in_the_workflow(workers) -> None:
    workers(*FAST)
    res = tasks_engine.enqueue("timed_step", {"timeout": 0.3, "hangs": 9, "max_attempts": 2})
    wait_for(lambda: status(res.run_id) == "completed", 30, "the run to complete")
    assert tasks_engine.get_run(res.run_id).output == {
        "slow": {"timed_out": "step 'slow' timed out after 0.3 seconds"},
        "after": {"aborted": False},
    }


@GROUP_COMMIT
def test_a_step_ignoring_its_timeout_is_written_off_and_its_thread_fenced(
    workers, group_commit: str
) -> None:
    """One slot: the retry can only run if the write-off gave the stuck thread's slot to a
    new thread. The stuck body returns once the test releases it, after the run completed,
    and its late result changes nothing. (Group commit: PostgreSQL workers only.)"""
    w = workers(*FAST, env={"TASKS_GROUP_COMMIT": group_commit})
    release = "release-stuck-step"
    res = tasks_engine.enqueue(
        "timed_step", {"timeout": 0.3, "hangs": 1, "watch": False, "release": release}
    )
    wait_for(lambda: status(res.run_id) == "completed", 60, "the retried run to complete")
    assert SideEffect.objects.filter(key="slow-returned").count() == 0  # still stuck
    done = attempts(res.run_id)
    assert done == [
        ("slow", "failed", 1, TIMEOUT),
        ("slow", "completed", 2, None),
        ("after", "completed", 1, None),
    ]
    assert "step ignored its timeout; attempt written off" in w.log()
    Marker.objects.create(key=release)
    wait_for(lambda: SideEffect.objects.filter(key="slow-returned").exists(), 30, "the release")
    wait_for(lambda: "lease lost; dropping the run" in w.log(), 30, "the stuck thread to drop")
    assert attempts(res.run_id) == done
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert (run.status, run.output["slow"]) == ("completed", {"attempt": 2})
    # The worker still serves runs with its one slot.
    res2 = tasks_engine.enqueue("noop", {"n": 5})
    wait_for(lambda: status(res2.run_id) == "completed", 30, "another run on the same worker")


@pytest.mark.both_dbs  # SQLite's write lock
def test_an_atomic_step_that_outlives_its_timeout_fails_and_its_write_never_commits(
    workers,
) -> None:
    """On SQLite the heartbeat waits for the write lock that this step's own transaction
    holds, so it cannot fire the timer before the body returns: the step finds it itself."""
    workers(*FAST)
    res = tasks_engine.enqueue("atomic_timed_step", {"timeout": 0.5, "hold": 1.5})
    wait_for(lambda: status(res.run_id) == "completed", 30, "the run to complete")
    assert tasks_engine.get_run(res.run_id).output == (
        "timed out: step 'write' timed out after 0.5 seconds"
    )
    assert attempts(res.run_id) == [("write", "failed", 1, TIMEOUT)]
    assert not Marker.objects.filter(key=f"atomic-timed:{res.run_id}").exists()


@pytest.mark.both_dbs  # the deadline against the database's clock
def test_a_default_deadline_fails_a_sleeping_run(workers) -> None:
    w = workers(*FAST)
    # The 2 s deadline counts from the enqueue: a worker still starting (seconds on a loaded
    # machine) could let it pass before the first step, which the test expects to run.
    wait_for(lambda: Worker.objects.filter(pid=w.pid).exists(), 60, "the worker to be up")
    res = tasks_engine.enqueue("deadline_sleeper")
    wait_for(lambda: status(res.run_id) == "failed", 60, "the deadline to fail the run")
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.error["type"] == "tasks_engine.exceptions.DeadlineExceededError"
    assert [s[:2] for s in attempts(res.run_id)][:2] == [
        ("before", "completed"),
        ("nap", "abandoned"),
    ]


def test_patched_keeps_a_run_mid_way_on_the_old_path_across_a_deploy(workers) -> None:
    old_worker = workers(*FAST, tag="old", env={"TASKS_TEST_PATCH_CODE": "old"})
    old = tasks_engine.enqueue("patched_flow").run_id
    wait_for(lambda: status(old) == "waiting", 30, "the old run to park on its fact")
    old_worker.send(signal.SIGTERM)
    assert old_worker.wait(30) == 0
    new_worker = workers(*FAST, tag="new", env={"TASKS_TEST_PATCH_CODE": "new"})
    new = tasks_engine.enqueue("patched_flow").run_id
    wait_for(lambda: status(new) == "waiting", 30, "the new run to park on its fact")
    for run_id in (old, new):
        tasks_engine.signal(run_id, "go")
    wait_for(lambda: status(old) == status(new) == "completed", 30, "both runs to complete")
    assert tasks_engine.get_run(old).output == {"path": "old"}
    assert tasks_engine.get_run(new).output == {"path": "new"}
    assert [s[0] for s in attempts(old)] == ["a", "b", "go"]
    assert [s[0] for s in attempts(new)] == ["a", "patch:use-c", "c", "go"]
    assert tasks_engine.get_run(old).unreached_steps == []
    new_worker.send(signal.SIGTERM)


def replay_check(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "TASKS_TEST_PATCH_CODE": code,
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "tasks", "replay-check", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_replay_check_catches_a_changed_step_kind_and_passes_clean_runs(workers) -> None:
    w = workers(*FAST, env={"TASKS_TEST_PATCH_CODE": "old"})
    changed = tasks_engine.enqueue("kind_changes").run_id
    clean = tasks_engine.enqueue("patched_flow").run_id
    wait_for(lambda: status(changed) == status(clean) == "waiting", 30, "both runs to park")
    w.send(signal.SIGTERM)
    assert w.wait(30) == 0
    same = replay_check("old", "--json")
    assert (same.returncode, json.loads(same.stdout)) == (0, [])
    deployed = replay_check("new", "--json")
    assert deployed.returncode == 1, deployed.stderr
    [found] = json.loads(deployed.stdout)
    assert (found["run_id"], found["task"], found["version"]) == (str(changed), "kind_changes", 1)
    assert "recorded as 'function'" in found["problem"]
    text = replay_check("new", "--task", "patched_flow")
    assert text.returncode == 0 and "all 1 unfinished runs match" in text.stdout
    bad = replay_check("new", "--task", "nope")
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0
    assert "unknown task 'nope'" in bad.stderr
