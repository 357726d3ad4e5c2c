"""Django tasks through DurableBackend with real `runworker` processes."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.utils import timezone

import tasks_engine
from tasks_engine.backends import DJANGO_TASK
from tasks_engine.models import WorkflowRun
from tests.helpers import wait_for
from tests.testapp import django_tasks as t
from tests.testapp.models import SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_db("the backend's behaviour through a worker"),
]

BURST = ("--burst", "--poll-interval", "0.2")


def finished(result_id: str) -> bool:
    return WorkflowRun.objects.get(pk=result_id).status in {"completed", "failed", "canceled"}


def test_success_and_failure_with_traceback(workers) -> None:
    ok = t.add.enqueue(20, 22)
    bad = t.boom.enqueue("in a worker")
    w = workers(*BURST, tag="w-ok")
    assert w.wait(60) == 0, w.log()
    got = t.add.get_result(ok.id)
    assert (got.status, got.return_value, got.attempts) == (TaskResultStatus.SUCCESSFUL, 42, 1)
    assert got.worker_ids[0].count(":") == 2  # host:pid:nonce, fresh on every process start
    failed = t.boom.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class is t.TaskBoom
    assert 'django_tasks.py", line' in failed.errors[0].traceback
    assert SideEffect.objects.filter(key="boom:in a worker").count() == 1
    assert SideEffect.objects.filter(key=f"signal:finished:FAILED:{bad.id}").count() == 1
    assert SideEffect.objects.filter(key=f"signal:started:RUNNING:{ok.id}", worker="w-ok").exists()


def test_run_after_is_respected_by_a_live_worker(workers) -> None:
    when = timezone.now() + timedelta(seconds=2)
    result = t.record.using(run_after=when).enqueue("deferred")
    workers("--poll-interval", "0.2")
    wait_for(lambda: finished(result.id), 30, "the deferred task")
    got = t.record.get_result(result.id)
    assert got.status == TaskResultStatus.SUCCESSFUL
    assert got.started_at is not None
    assert when <= got.started_at < when + timedelta(seconds=2)


@pytest.mark.both_dbs  # the claim statement is the dialect's
def test_priority_orders_the_claims(workers) -> None:
    low = [t.record.enqueue(f"low-{i}") for i in range(3)]
    high = t.record.using(priority=50).enqueue("high")
    w = workers("--concurrency", "1", *BURST)
    assert w.wait(60) == 0, w.log()
    order = list(
        SideEffect.objects.filter(key__in=["high", "low-0", "low-1", "low-2"])
        .order_by("id")
        .values_list("key", flat=True)
    )
    assert order[0] == "high"
    assert {t.record.get_result(r.id).status for r in [*low, high]} == {TaskResultStatus.SUCCESSFUL}


@pytest.mark.both_dbs  # a transaction
def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(workers) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        t.record.enqueue("ghost")
        raise RuntimeError("rolled back")
    kept = t.record.enqueue("kept")
    w = workers(*BURST)
    assert w.wait(60) == 0, w.log()
    assert [str(pk) for pk in WorkflowRun.objects.values_list("pk", flat=True)] == [kept.id]
    assert not SideEffect.objects.filter(key="ghost").exists()
    assert SideEffect.objects.filter(key="kept").count() == 1


def test_a_task_killed_mid_call_is_not_run_again_unless_it_asked(workers) -> None:
    once = t.slow.enqueue("once", 30)
    first = workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="doomed")
    wait_for(lambda: SideEffect.objects.filter(key="once:start").exists(), 30, "the call")
    first.send(signal.SIGKILL)
    first.wait(10)
    workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="rescuer")
    wait_for(lambda: finished(once.id), 30, "the run to end")
    got = t.slow.get_result(once.id)
    assert got.status == TaskResultStatus.FAILED
    assert "interrupted 1 times" in got.errors[-1].traceback
    assert SideEffect.objects.filter(key="once:start").count() == 1


def test_a_task_killed_mid_call_reports_the_one_attempt_that_ran(workers) -> None:
    """max_attempts=1, its worker SIGKILLed mid-call: the rescuer records that it gives up (a
    failed row of the call step, the reason the task failed) without calling the task. The
    result reports one attempt, by the killed worker, and that failure as its error (it
    reported two attempts, the give-up's worker among them)."""
    once = t.slow.enqueue("killed", 30)
    doomed = workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="doomed")
    wait_for(lambda: SideEffect.objects.filter(key="killed:start").exists(), 30, "the call")
    running = t.slow.get_result(once.id)
    assert (running.status, running.attempts) == (TaskResultStatus.RUNNING, 1)
    doomed.send(signal.SIGKILL)
    doomed.wait(10)
    workers("--lease-seconds", "2", "--poll-interval", "0.2", tag="rescuer")
    wait_for(lambda: finished(once.id), 30, "the run to end")
    got = t.slow.get_result(once.id)
    assert got.status == TaskResultStatus.FAILED
    assert got.attempts == 1
    assert got.worker_ids == running.worker_ids  # the killed worker's, not the rescuer's
    assert got.last_attempted_at == running.last_attempted_at
    assert [e.exception_class_path for e in got.errors] == [
        "tasks_engine.exceptions.StepFailedError"
    ]
    assert "interrupted 1 times" in got.errors[0].traceback
    assert SideEffect.objects.filter(key="killed:start").count() == 1


def test_async_tasks_and_bad_paths_do_not_wedge_the_worker(workers) -> None:
    bad = tasks_engine.enqueue(DJANGO_TASK, {"task": "tests.testapp.missing.task"})
    doubled = t.async_double.enqueue(8)
    w = workers(*BURST)
    assert w.wait(60) == 0, w.log()
    assert WorkflowRun.objects.get(pk=bad.run_id).status == "failed"
    assert t.async_double.get_result(doubled.id).return_value == 16
