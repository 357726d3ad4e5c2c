"""Real `manage.py runworker` processes, on PostgreSQL and SQLite: crashes, drains, filters,
shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import tasks_engine
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import ROOT, database_url, wait_for
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def effects(key: str) -> int:
    return SideEffect.objects.filter(key=key).count()


def finished(run_id) -> bool:
    return WorkflowRun.objects.get(pk=run_id).status in {"completed", "failed", "canceled"}


@pytest.mark.both_dbs  # SQLite's renewal once canceled
def test_sigkill_mid_step_reruns_only_the_interrupted_step(workers) -> None:
    """The rerun (3 s) outlives several heartbeats of its 2 s lease: on SQLite, where every
    renewal once reported a cancel, it ended `canceled`."""
    res = tasks_engine.enqueue("slow_middle", {"seconds": 3})
    first = workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="doomed")
    wait_for(lambda: effects("middle-start") == 1, 30, "the middle step to start")
    first.send(signal.SIGKILL)
    first.wait(10)
    second = workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="rescuer")
    wait_for(lambda: finished(res.run_id), 60, "the run to finish")
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "completed", second.log()
    assert (effects("first"), effects("middle-start"), effects("middle-end"), effects("last")) == (
        1,
        2,
        1,
        1,
    )
    middle = [(s.attempt, s.status) for s in view.steps if s.name == "middle"]
    assert middle == [(1, "abandoned"), (2, "completed")]
    assert SideEffect.objects.get(key="middle-end").worker == "rescuer"
    assert not StepAttempt.objects.filter(status="running").exists()


@pytest.mark.both_dbs  # concurrent claims
def test_two_workers_drain_200_runs_exactly_once(workers) -> None:
    ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(200)]
    a = workers("--concurrency", "4", "--burst", "--poll-interval", "0.2", tag="a")
    b = workers("--concurrency", "4", "--burst", "--poll-interval", "0.2", tag="b")
    assert a.wait(120) == 0, a.log()
    assert b.wait(120) == 0, b.log()
    assert WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 200
    keys = list(SideEffect.objects.values_list("key", flat=True))
    assert sorted(keys) == sorted(f"noop:{i}" for i in range(200))  # each body exactly once
    assert set(SideEffect.objects.values_list("worker", flat=True)) <= {"a", "b"}
    assert not WorkflowRun.objects.exclude(status="completed").exists()


@pytest.mark.one_db("the prefetch is group commit's, PostgreSQL's")
def test_sigterm_under_a_deep_prefetch_hands_back_every_run_it_claimed(workers) -> None:
    """A worker of quick runs claims ahead of its slots (up to 8 x its concurrency on
    PostgreSQL): stopped mid-backlog, it must not leave one of those runs leased, and no run
    may execute twice."""
    from django.db import connection, transaction

    with transaction.atomic():
        ids = [tasks_engine.enqueue("noop", {"n": i}).run_id for i in range(3000)]
    first = workers("--concurrency", "4", "--grace-seconds", "5", tag="deployed")
    wait_for(lambda: effects_like("noop:") >= 300, 60, "the drain to get going")
    claimed = WorkflowRun.objects.filter(status="running").count()
    first.send(signal.SIGTERM)
    assert first.wait(30) == 0, first.log()
    if connection.vendor == "postgresql":
        assert claimed > 4, "the worker had claimed no run ahead of its four slots"
    assert not WorkflowRun.objects.filter(status="running").exists()
    assert not WorkflowRun.objects.filter(lease_token__isnull=False).exists()
    second = workers("--burst", "--poll-interval", "0.2", tag="next")
    assert second.wait(120) == 0, second.log()
    assert WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == 3000
    keys = sorted(SideEffect.objects.values_list("key", flat=True))
    assert keys == sorted(f"noop:{i}" for i in range(3000))  # each body exactly once


def effects_like(prefix: str) -> int:
    return SideEffect.objects.filter(key__startswith=prefix).count()


@pytest.mark.both_dbs  # the claim statement is the dialect's
def test_worker_claims_only_registered_name_and_version(workers) -> None:
    a1 = tasks_engine.enqueue("a", version=1)
    a2 = tasks_engine.enqueue("a", version=2)
    b = tasks_engine.enqueue("b")
    w = workers("--task", "a@1", "--burst", "--poll-interval", "0.2")
    assert w.wait(60) == 0, w.log()
    assert tasks_engine.get_run(a1.run_id).status == "completed"
    for other in (a2, b):
        view = tasks_engine.get_run(other.run_id)
        assert (view.status, view.attempts) == ("pending", 0)


@pytest.mark.both_dbs  # the claim statement is the dialect's
def test_a_worker_serves_a_queue_that_queues_does_not_name(workers) -> None:
    """Queues are open: with QUEUES limiting other queues, runs enqueued to "bulk" (by the
    API and by `tasks enqueue --queue`) get a dedicated `runworker --queue bulk`, and no
    command warns about the workflows' queues QUEUES leaves out."""
    import json

    env = {"TEST_TASKS_QUEUES": json.dumps({"flow-io": {"concurrency": 2}})}
    by_api = tasks_engine.enqueue("noop", {"n": 1}, queue="bulk")
    by_cli = run_command(
        "tasks", "enqueue", "noop", "--input", '{"n": 2}', "--queue", "bulk", "--json", env=env
    )
    assert by_cli.returncode == 0, by_cli.stderr
    elsewhere = tasks_engine.enqueue("noop", {"n": 3})
    w = workers("--queue", "bulk", "--burst", "--poll-interval", "0.1", env=env, tag="bulk")
    assert w.wait(60) == 0, w.log()
    for run_id in (by_api.run_id, json.loads(by_cli.stdout)["run_id"]):
        assert tasks_engine.get_run(run_id).status == "completed", w.log()
    assert tasks_engine.get_run(elsewhere.run_id).status == "pending"  # not its queue
    assert set(SideEffect.objects.values_list("worker", flat=True)) == {"bulk"}
    assert "tasks_engine.W023" not in w.log() + by_cli.stderr


@pytest.mark.both_dbs  # the claim statement is the dialect's
def test_with_one_slot_the_higher_priority_run_starts_first(workers) -> None:
    low = tasks_engine.enqueue("busy_step", priority=0)
    high = tasks_engine.enqueue("busy_step", priority=5)
    w = workers("--concurrency", "1", "--burst", "--poll-interval", "0.2")
    assert w.wait(60) == 0, w.log()
    lo, hi = (WorkflowRun.objects.get(pk=x.run_id) for x in (low, high))
    assert hi.started_at < lo.started_at
    assert hi.finished_at <= lo.started_at


@pytest.mark.one_db("the worker's SIGTERM")
def test_sigterm_hands_the_run_back_long_before_the_lease_expires(workers) -> None:
    res = tasks_engine.enqueue("slow_middle", {"seconds": 30})
    first = workers(
        "--lease-seconds", "120", "--grace-seconds", "1", "--poll-interval", "0.2", tag="deployed"
    )
    wait_for(lambda: effects("middle-start") == 1, 30, "the middle step to start")
    sent = time.time()
    first.send(signal.SIGTERM)
    assert first.wait(20) == 0, first.log()
    run = WorkflowRun.objects.get(pk=res.run_id)
    assert run.status == "pending" and run.lease_token is None  # handed back, not left leased
    abandoned = StepAttempt.objects.get(run_id=res.run_id, name="middle", attempt=1)
    assert (abandoned.status, abandoned.counted) == ("abandoned", False)
    workers("--poll-interval", "0.2", tag="next")
    wait_for(lambda: effects("middle-start") == 2, 30, "another worker to take the run")
    taken = time.time()
    assert taken - sent < 60  # the 120 s lease never had to expire


@pytest.mark.one_db("the crash count")
def test_sigkill_in_a_step_that_always_kills_its_worker_ends_failed(workers) -> None:
    res = tasks_engine.enqueue("crasher")
    for i in range(3):
        w = workers("--lease-seconds", "1", "--poll-interval", "0.2", "--burst", tag=f"victim{i}")
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            break
    wait_for(lambda: finished(res.run_id), 30, "the run to fail")
    view = tasks_engine.get_run(res.run_id)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.StepFailedError"
    assert effects("crash") == 2  # max_attempts=2, then failed for good


def run_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.one_db("an argument error")
def test_a_bad_worker_argument_fails_with_one_line() -> None:
    """manage.py itself: one line on stderr, exit 1 (a CommandError), nothing written. The
    other bad arguments are checked in-process (tests/engine/management/test_command_errors.py)."""
    out = run_command("runworker", "--task", "nope@1")
    assert out.returncode == 1
    assert out.stderr == "CommandError: unknown task nope@1\n"
    assert WorkflowRun.objects.count() == 0
