"""Several threads claim at the same instant, each on its own connection: no limit is ever
exceeded (PostgreSQL: the advisory locks; SQLite: BEGIN IMMEDIATE)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

import tasks_engine
from tasks_engine import transitions
from tasks_engine.models import QueueClaim, WorkflowRun
from tests.engine.transitions.test_flow_control import (
    FLOW,
    _plain_claims_after,
    finish,
    limit_queues,
)

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 6
_ = _plain_claims_after  # autouse here too


def running_by(field: str) -> dict[Any, int]:
    rows = WorkflowRun.objects.filter(status="running").values(field).annotate(n=Count("id"))
    return {r[field]: r["n"] for r in rows}


def in_threads(
    body: Callable[[int], None],
    n: int,
    timeout: float,
    barrier: threading.Barrier | None = None,
) -> list[BaseException]:
    """Run body(0), ..., body(n - 1) at once, each on a thread (and connection) of its own;
    what they raised. A failing thread aborts `barrier`, so the others do not wait for it."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            body(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            if barrier is not None:
                barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors


def claim_together(rounds: int, then: Any = None) -> list[BaseException]:
    barrier = threading.Barrier(THREADS)

    def claimer(i: int) -> None:
        for _ in range(rounds):
            barrier.wait(timeout=60)
            got = transitions.claim_runs(f"w{i}", FLOW, None, 3, 600.0)
            if then is not None:
                then(got)

    return in_threads(claimer, THREADS, 120, barrier)


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


def most_at_once(spans: list[tuple[float, float, Any]]) -> dict[Any, int]:
    """The highest number of spans of each group open at once (an end before a start at the
    same instant)."""
    events = sorted((t, kind, g) for start, end, g in spans for t, kind in ((start, 1), (end, 0)))
    now: dict[Any, int] = {}
    most: dict[Any, int] = {}
    for _, kind, g in events:
        now[g] = now.get(g, 0) + (1 if kind else -1)
        most[g] = max(most.get(g, 0), now[g])
    return most


@pytest.mark.parametrize("queue_limit", [None, 3])
def test_many_claimers_each_on_its_own_connection_never_over_admit(
    settings: Any, queue_limit: int | None
) -> None:
    """Twelve threads claim, run and finish as fast as they can, until everything ran. Each
    run's span is recorded after its claim committed and before its end is written, so spans
    of runs that never ran together cannot overlap: the observed maxima bound the truth.
    Without a queue limit nothing but the keys' own locks serialises the claims."""
    limit_queues(settings, {"flow-io": {"concurrency": queue_limit}} if queue_limit else {})
    for disk in "abc":
        for _ in range(8):
            tasks_engine.enqueue("flow-disk", {"disk": disk})
    for _ in range(8):
        tasks_engine.enqueue("flow-pair", {})
    for i in range(12):  # the queue's limit, and keys inside it
        key = "io-key" if i % 2 else None
        tasks_engine.enqueue("flow-plain", {}, concurrency_key=key)
    total = WorkflowRun.objects.count()
    spans: list[tuple[float, float, Any, str]] = []
    lock = threading.Lock()
    start = threading.Barrier(12)

    def claimer(i: int) -> None:
        start.wait(timeout=60)
        idle = 0
        while idle < 20:
            got = transitions.claim_runs(f"w{i}", FLOW, None, 2, 600.0)
            if not got:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            began = time.monotonic()
            time.sleep(0.002)
            ended = time.monotonic()
            with lock:
                spans.extend((began, ended, c.run.concurrency_key, c.run.queue) for c in got)
            finish(got)

    errors = in_threads(claimer, 12, 180)
    assert errors == []
    assert len(spans) == total
    assert WorkflowRun.objects.exclude(status="completed").count() == 0
    by_key = most_at_once([(a, b, k) for a, b, k, _ in spans if k])
    assert by_key["disk:a"] == by_key["disk:b"] == by_key["disk:c"] == 1
    assert by_key["pair"] <= 2 and by_key["io-key"] == 1
    if queue_limit:
        assert most_at_once([(a, b, q) for a, b, _, q in spans])["flow-io"] <= queue_limit


def test_a_rate_limit_holds_under_simultaneous_claims(settings: Any) -> None:
    """Six threads claim three runs each at the same instant, three times: the queue's ring
    admits exactly its rate's count, fleet-wide."""
    limit_queues(settings, {"flow-io": {"rate_limit": "5/h"}})
    for _ in range(30):
        tasks_engine.enqueue("flow-plain", {})
    assert claim_together(rounds=3) == []
    assert running_by("queue").get("flow-io") == 5
    logged = QueueClaim.objects.filter(queue="flow-io").aggregate(n=Sum("claims"))["n"]
    assert logged == 5


def test_random_claims_and_exits_never_over_admit(settings: Any) -> None:
    """Twelve threads claim batches of random sizes and end what they got by random exits
    (completed by the executor, canceled, failed, handed back to pending, parked waiting
    with a due timer), each written behind the claim's back as any other path would; after
    every claim the running runs per key and per queue are within their limits."""
    limit_queues(settings, {"flow-io": {"concurrency": 3}})
    for disk in "abc":
        for _ in range(10):
            tasks_engine.enqueue("flow-disk", {"disk": disk})
    for _ in range(10):
        tasks_engine.enqueue("flow-pair", {})
    for i in range(16):
        tasks_engine.enqueue("flow-plain", {}, concurrency_key="io-key" if i % 2 else None)
    violations: list[Any] = []
    start = threading.Barrier(12)

    def end(c: transitions.Claimed, how: int) -> None:
        runs = WorkflowRun.objects.filter(pk=c.run.pk, lease_token=c.lease.token)
        if how == 0:
            finish([c])
        elif how == 1:
            runs.update(status="canceled", lease_token=None, available_at=None)
        elif how == 2:
            runs.update(status="failed", lease_token=None, available_at=None)
        elif how == 3:
            runs.update(status="pending", lease_token=None, available_at=timezone.now())
        else:
            runs.update(status="waiting", lease_token=None, available_at=timezone.now())

    def claimer(i: int) -> None:
        rng = random.Random(i)
        start.wait(timeout=60)
        idle = 0
        while idle < 30:
            got = transitions.claim_runs(f"w{i}", FLOW, None, rng.randint(1, 4), 600.0)
            by_key, by_queue = running_by("concurrency_key"), running_by("queue")
            if by_queue.get("flow-io", 0) > 3 or any(
                n > (2 if k == "pair" else 1) for k, n in by_key.items() if k
            ):
                violations.append((by_key, by_queue))
            if not got:
                idle += 1
                time.sleep(0.003)
                continue
            idle = 0
            time.sleep(rng.random() / 500)
            for c in got:
                end(c, rng.choice([0, 0, 1, 2, 3, 4]))

    errors = in_threads(claimer, 12, 240)
    assert errors == [] and violations == []
    assert not WorkflowRun.objects.filter(status__in=["pending", "running"]).exists()
