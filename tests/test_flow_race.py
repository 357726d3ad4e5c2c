"""Several threads claim at the same instant, each on its own connection: no limit is ever
exceeded (PostgreSQL: the advisory locks; SQLite: BEGIN IMMEDIATE)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count

import tasks_engine
from tasks_engine import transitions
from tasks_engine.models import WorkflowRun
from tests.test_flow_control import FLOW, _plain_claims_after, finish, limit_queues

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 6
_ = _plain_claims_after  # autouse here too


def running_by(field: str) -> dict[Any, int]:
    rows = WorkflowRun.objects.filter(status="running").values(field).annotate(n=Count("id"))
    return {r[field]: r["n"] for r in rows}


def claim_together(rounds: int, then: Any = None) -> list[BaseException]:
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        try:
            for _ in range(rounds):
                barrier.wait(timeout=60)
                got = transitions.claim_runs(f"w{i}", FLOW, None, 3, 600.0)
                if then is not None:
                    then(got)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_simultaneous_claims_never_over_admit(settings: Any) -> None:
    limit_queues(settings, {"flow-io": {"concurrency": 3}})
    for disk in "abcd":
        for _ in range(6):
            tasks_engine.enqueue("flow-disk", {"disk": disk})
    for _ in range(5):
        tasks_engine.enqueue("flow-pair", {})
    for _ in range(12):
        tasks_engine.enqueue("flow-plain", {})  # queue flow-io
    assert claim_together(rounds=5) == []
    by_key = running_by("concurrency_key")
    assert {k: n for k, n in by_key.items() if k} == {f"disk:{d}": 1 for d in "abcd"} | {"pair": 2}
    assert running_by("queue").get("flow-io") == 3


def test_claiming_and_finishing_together_never_over_admit(settings: Any) -> None:
    limit_queues(settings, {"flow-io": {"concurrency": 2}})
    for disk in "ab":
        for _ in range(8):
            tasks_engine.enqueue("flow-disk", {"disk": disk})
    for _ in range(8):
        tasks_engine.enqueue("flow-plain", {})
    seen: list[tuple[dict[Any, int], dict[Any, int]]] = []

    def observe_then_finish(got: list[transitions.Claimed]) -> None:
        seen.append((running_by("concurrency_key"), running_by("queue")))
        finish(got)

    assert claim_together(rounds=12, then=observe_then_finish) == []
    for by_key, by_queue in seen:
        assert all(n <= 1 for k, n in by_key.items() if k), by_key
        assert by_queue.get("flow-io", 0) <= 2, by_queue
    assert WorkflowRun.objects.exclude(status="completed").count() == 0  # all got their turn
