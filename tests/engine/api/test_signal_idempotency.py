"""signal(..., idempotency_key=K): one fact per (run, K) however often it is sent, and every
repeat answers as the first signal did; a concurrent duplicate neither raises nor stores two."""

from __future__ import annotations

import json
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

import tasks_engine
from tasks_engine import Signaled
from tasks_engine.models import Fact, WorkflowRun
from tests.helpers import FakeClock, drain


@pytest.mark.django_db
def test_the_same_key_stores_one_fact_and_answers_as_the_first(fake_clock: FakeClock) -> None:
    run_id = tasks_engine.enqueue("fact_waiter", {"count": 2}).run_id
    drain(fake_clock)
    first = tasks_engine.signal(run_id, "item", {"n": 1}, idempotency_key="hook:1")
    assert first == Signaled(True, "pending")  # it woke the run
    again = tasks_engine.signal(run_id, "item", {"n": 1}, idempotency_key="hook:1")
    assert again == first
    assert Fact.objects.filter(run_id=run_id).count() == 1
    drain(fake_clock)  # takes the one fact, waits for the second
    # Another payload with the same key: answered as the first, the first payload kept.
    assert tasks_engine.signal(run_id, "item", {"n": 9}, idempotency_key="hook:1") == first
    assert list(Fact.objects.filter(run_id=run_id).values_list("payload", flat=True)) == [{"n": 1}]
    assert tasks_engine.signal(run_id, "item", {"n": 2}, idempotency_key="hook:2").delivered
    drain(fake_clock)
    assert WorkflowRun.objects.get(pk=run_id).output == [{"n": 1}, {"n": 2}]
    # Finished now: a new key is refused, a known one still answers as it first did.
    assert tasks_engine.signal(run_id, "item", idempotency_key="hook:3") == Signaled(
        False, "completed"
    )
    assert tasks_engine.signal(run_id, "item", idempotency_key="hook:2") == Signaled(
        True, "pending"
    )
    assert Fact.objects.filter(run_id=run_id).count() == 2


@pytest.mark.django_db
def test_keys_are_per_run_and_signals_without_a_key_are_not_deduplicated() -> None:
    a = tasks_engine.enqueue("fact_waiter", {}).run_id
    b = tasks_engine.enqueue("fact_waiter", {}).run_id
    assert tasks_engine.signal(a, "item", 1, idempotency_key="k").delivered
    assert tasks_engine.signal(b, "item", 1, idempotency_key="k").delivered
    tasks_engine.signal(a, "item", 1)
    tasks_engine.signal(a, "item", 1)
    assert Fact.objects.filter(run_id=a).count() == 3
    assert Fact.objects.filter(run_id=b).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", 5])
def test_a_bad_key_is_refused_and_nothing_is_stored(key: Any) -> None:
    run_id = tasks_engine.enqueue("fact_waiter", {}).run_id
    with pytest.raises(ValueError, match="idempotency_key"):
        tasks_engine.signal(run_id, "item", 1, idempotency_key=key)
    assert not Fact.objects.exists()


@pytest.mark.django_db
def test_cli_signal_with_an_idempotency_key() -> None:
    run_id = tasks_engine.enqueue("fact_waiter", {}).run_id

    def send() -> dict[str, Any]:
        out = StringIO()
        call_command(
            "tasks", "signal", str(run_id), "item", "--payload", "7",
            "--idempotency-key", "done:1", "--json", stdout=out,
        )  # fmt: skip
        return json.loads(out.getvalue())

    assert send() == {"delivered": True, "status": "pending"}
    assert send() == {"delivered": True, "status": "pending"}
    assert Fact.objects.filter(run_id=run_id).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicates_store_one_fact_and_raise_nothing() -> None:
    run_ids = [tasks_engine.enqueue("fact_waiter", {}).run_id for _ in range(5)]
    answers: list[Signaled] = []
    errors: list[BaseException] = []
    for run_id in run_ids:
        barrier = threading.Barrier(4)

        def send(rid: uuid.UUID = run_id, barrier: threading.Barrier = barrier) -> None:
            try:
                barrier.wait()
                answers.append(tasks_engine.signal(rid, "item", {"x": 1}, idempotency_key="same"))
            except BaseException as exc:  # noqa: BLE001 - the test reports every error
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert len(answers) == 20 and all(a == Signaled(True, "pending") for a in answers)
    for run_id in run_ids:
        assert Fact.objects.filter(run_id=run_id).count() == 1
