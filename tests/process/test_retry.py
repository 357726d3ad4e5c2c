"""Retry and wait with a real worker process: a run fails, an operator retries it, wait()
sees it complete, and the step that had completed was not executed twice."""

from __future__ import annotations

import pytest

import tasks_engine
from tasks_engine.models import StepAttempt
from tests.testapp.models import Marker, SideEffect

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_db("an operator's retry and wait()"),
]


def effects(key: str) -> list[str]:
    return sorted(
        SideEffect.objects.filter(key__startswith=f"{key}:").values_list("key", flat=True)
    )


def test_a_failed_run_is_retried_and_completes_without_rerunning_a_completed_step(
    workers,
) -> None:
    workers("--concurrency", "2", "--poll-interval", "0.2")
    run_id = tasks_engine.enqueue("gated", {"key": "p"}).run_id
    failed = tasks_engine.wait(run_id, timeout=60)
    assert failed.status == "failed" and failed.error["message"] == "gate p is closed"
    assert effects("p") == ["p:a", "p:b"]
    Marker.objects.create(key="p:open")
    assert tasks_engine.retry_run(run_id, reason="gate opened") is True
    done = tasks_engine.wait(run_id, timeout=60)
    assert (done.status, done.output) == ("completed", {"done": ["a", "b", "c"]})
    assert effects("p") == ["p:a", "p:b", "p:b", "p:c"]
    assert done.retries[0]["reason"] == "gate opened"


def test_retry_from_a_step_with_a_real_worker(workers) -> None:
    workers("--poll-interval", "0.2")
    run_id = tasks_engine.enqueue("gated", {"key": "q", "gate_step": "c"}).run_id
    assert tasks_engine.wait(run_id, timeout=60).status == "failed"
    Marker.objects.create(key="q:open")
    assert tasks_engine.retry_run(run_id, from_step="b") is True
    assert tasks_engine.wait(run_id, timeout=60).status == "completed"
    assert effects("q") == ["q:a", "q:b", "q:b", "q:c", "q:c"]
    old = StepAttempt.objects.filter(run_id=run_id, superseded=True)
    assert sorted(old.values_list("name", "status")) == [("b", "completed"), ("c", "failed")]


def test_wait_follows_a_run_through_a_fact_to_its_end(workers) -> None:
    Marker.objects.create(key="r:open")
    workers("--poll-interval", "5")
    run_id = tasks_engine.enqueue("gated", {"key": "r", "wait_fact": True}).run_id
    with pytest.raises(TimeoutError):
        tasks_engine.wait(run_id, timeout=1)
    tasks_engine.signal(run_id, "go", 1)
    assert tasks_engine.wait(run_id, timeout=60).output == {"done": ["a", 1, "b", "c"]}
