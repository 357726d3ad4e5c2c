"""The async API (`aenqueue`, `aenqueue_many`, `asignal`, `acancel`, `aget_run`, `alist_runs`,
`aretry_run`, `await_run`): the plain API's answers and errors, from async code."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import async_to_sync
from pydantic import ValidationError

import tasks_engine
from tasks_engine import UnknownRunError
from tasks_engine.models import WorkflowRun
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


def test_the_async_api_mirrors_the_plain_one(fake_clock: FakeClock) -> None:
    async def calls() -> dict:
        one = await tasks_engine.aenqueue("async_full", {"sleep": 0})
        many = await tasks_engine.aenqueue_many("async_basic", [{}, {"pause": 0.01}])
        listed = await tasks_engine.alist_runs(task="async_basic")
        view = await tasks_engine.aget_run(one.run_id)
        signaled = await tasks_engine.asignal(one.run_id, "approved", {"ok": 1})
        canceled = await tasks_engine.acancel(many[0].run_id, reason="not needed")
        return {
            "one": one,
            "many": many,
            "listed": listed,
            "view": view,
            "signaled": signaled,
            "canceled": canceled,
        }

    got = async_to_sync(calls)()
    assert {v.run_id for v in got["listed"]} == {e.run_id for e in got["many"]}
    assert got["view"].status == "pending"
    assert got["signaled"].delivered and got["canceled"]
    drain(fake_clock)
    done = async_to_sync(tasks_engine.await_run)(got["one"].run_id, timeout=5)
    assert done.status == "completed" and done.output["fact"] == {"ok": 1}
    canceled = async_to_sync(tasks_engine.await_run)(got["many"][0].run_id)
    assert canceled.status == "canceled"
    assert async_to_sync(tasks_engine.aretry_run)(canceled.run_id, reason="again")
    assert WorkflowRun.objects.get(pk=canceled.run_id).status == "pending"


def test_await_run_errors() -> None:
    with pytest.raises(UnknownRunError):
        async_to_sync(tasks_engine.await_run)(uuid.uuid4())
    with pytest.raises(UnknownRunError):
        async_to_sync(tasks_engine.await_run)("not a run id")
    rid = tasks_engine.enqueue("async_basic", {}).run_id
    with pytest.raises(TimeoutError, match="did not finish in time"):
        async_to_sync(tasks_engine.await_run)(rid, timeout=0.1)
    bad: object
    for bad in (-1, "1", True, float("nan")):
        with pytest.raises(ValueError, match="timeout must be a number of seconds"):
            async_to_sync(tasks_engine.await_run)(rid, timeout=bad)  # type: ignore[arg-type]


def test_aenqueue_refuses_bad_input_and_writes_nothing() -> None:
    with pytest.raises(ValidationError):
        async_to_sync(tasks_engine.aenqueue)("async_basic", {"pause": "soon"})
    with pytest.raises(ValidationError):
        async_to_sync(tasks_engine.aenqueue_many)("async_basic", [{}, {"pause": "soon"}])
    assert not WorkflowRun.objects.exists()
