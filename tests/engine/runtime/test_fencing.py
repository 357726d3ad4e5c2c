"""ctx.with_attempt_token and the op ledger, driven in-process on both databases."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import tasks_engine
from tasks_engine import FencingError, transitions
from tasks_engine.models import OpLedger
from tasks_engine.runtime import executor
from tests.helpers import FakeClock
from tests.testapp.models import Marker

pytestmark = pytest.mark.django_db


def claim_ctx(task: str = "b"):
    [c] = transitions.claim_runs("w", [(task, 1)], None, 1, 30)
    _, ctx = executor.build_context(c.run, c.lease, threading.Event(), c.prestarted)
    return ctx


def test_first_call_runs_fn_commits_and_stores_the_result() -> None:
    tasks_engine.enqueue("b")
    ctx = claim_ctx()
    calls = []

    def fn(info):
        calls.append(info)
        return {"torrent": "abc"}

    out = ctx.with_attempt_token(
        "op-1", fn, commit=lambda r: Marker.objects.create(key="m1", value=r["torrent"])
    )
    assert out == {"torrent": "abc"}
    assert [c.resumed for c in calls] == [False]
    assert calls[0].attempt_token == ctx.attempt_token
    entry = OpLedger.objects.get(op_key="op-1")
    assert (entry.status, entry.result, entry.run_id) == ("done", {"torrent": "abc"}, ctx.run_id)
    assert Marker.objects.get(key="m1").value == "abc"
    # A second call with the same key returns the stored result without calling fn.
    assert ctx.with_attempt_token("op-1", fn) == {"torrent": "abc"}
    assert len(calls) == 1


def test_an_op_started_by_a_crashed_attempt_is_resumed(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b")
    first = claim_ctx()

    def crash(info):
        raise KeyboardInterrupt  # the worker "dies" after the started row committed

    with pytest.raises(KeyboardInterrupt):
        first.with_attempt_token("op-2", crash)
    assert OpLedger.objects.get(op_key="op-2").status == "started"
    fake_clock.advance(31)
    second = claim_ctx()
    seen: list[bool] = []

    def fn(info) -> str:
        seen.append(info.resumed)
        return "done"

    out = second.with_attempt_token("op-2", fn)
    assert (seen, out) == ([True], "done")
    assert OpLedger.objects.get(op_key="op-2").attempt_token == second.attempt_token


def test_a_stale_attempt_cannot_commit(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b")
    stale = claim_ctx()
    holder: dict[str, Any] = {}

    def slow(info):
        # While this attempt works, its lease expires and another worker takes the run.
        fake_clock.advance(31)
        holder["new"] = claim_ctx()
        return "stale result"

    with pytest.raises(FencingError):
        stale.with_attempt_token(
            "op-3", slow, commit=lambda r: Marker.objects.create(key="stale", value=r)
        )
    assert not Marker.objects.filter(key="stale").exists()
    assert OpLedger.objects.get(op_key="op-3").status == "started"
    fresh = holder["new"]
    out = fresh.with_attempt_token(
        "op-3",
        lambda info: f"resumed={info.resumed}",
        commit=lambda r: Marker.objects.create(key="fresh", value=r),
    )
    assert out == "resumed=True"
    assert list(Marker.objects.values_list("key", "value")) == [("fresh", "resumed=True")]


def test_a_failing_commit_rolls_back_the_result() -> None:
    tasks_engine.enqueue("b")
    ctx = claim_ctx()

    def bad_commit(result):
        Marker.objects.create(key="half")
        raise ValueError("business rule says no")

    with pytest.raises(ValueError):
        ctx.with_attempt_token("op-4", lambda info: 1, commit=bad_commit)
    assert not Marker.objects.filter(key="half").exists()
    assert OpLedger.objects.get(op_key="op-4").status == "started"


def test_stale_attempt_cannot_even_start_an_op(fake_clock: FakeClock) -> None:
    tasks_engine.enqueue("b")
    stale = claim_ctx()
    fake_clock.advance(31)
    claim_ctx()
    with pytest.raises(FencingError):
        stale.with_attempt_token("op-5", lambda info: 1)
    assert not OpLedger.objects.filter(op_key="op-5").exists()
