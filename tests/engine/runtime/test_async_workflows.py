"""`async def` workflows, in-process (`drain`: the loop on a helper thread, this thread doing
the engine's work): every kind of step awaited, replay, and the TypeErrors that say what to
write instead. Real worker processes: tests/process/test_async.py."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

import tasks_engine
from tasks_engine import AsyncTaskContext, TaskContext, workflow
from tasks_engine.definitions import registry
from tasks_engine.exceptions import AsyncStepError
from tasks_engine.models import StepAttempt, WorkflowRun
from tests.helpers import FakeClock, drain
from tests.testapp.models import Marker, SideEffect

pytestmark = pytest.mark.django_db


def run(run_id) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=run_id)


def steps(run_id) -> list[tuple[str, str, str]]:
    return list(
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("name", "kind", "status")
    )


def test_an_async_workflow_awaits_async_plain_and_coroutine_returning_steps(
    fake_clock: FakeClock,
) -> None:
    rid = tasks_engine.enqueue("async_basic", {"sleep": 5}).run_id
    assert drain(fake_clock) == ["suspended", "completed"]
    r = run(rid)
    assert r.status == "completed"
    assert r.output["twice"] == 42
    assert r.output["lookup"]["loop"] != r.output["plain"]["thread"]
    assert steps(rid) == [
        ("lookup", "function", "completed"),
        ("plain", "function", "completed"),
        ("cool-down", "sleep", "completed"),
        ("lambda", "function", "completed"),
    ]
    # The claim after the sleep replayed the first two steps: their bodies ran once.
    assert SideEffect.objects.filter(run_id=rid).count() == 1


def test_every_kind_of_step_in_an_async_workflow(fake_clock: FakeClock) -> None:
    rid = tasks_engine.enqueue("async_full", {"sleep": 3}).run_id
    drain(fake_clock)
    assert run(rid).status == "waiting"
    assert tasks_engine.signal(rid, "approved", {"ok": 1}).delivered
    drain(fake_clock)
    r = run(rid)
    assert r.status == "completed", r.error
    assert r.output == {
        "fact": {"ok": 1},
        "child": {"child": True},
        "atomic": "written",
        "op": {"resumed": False},
        "patched": True,
    }
    assert Marker.objects.filter(key=f"atomic:{rid}").exists()
    assert Marker.objects.get(key=f"op:{rid}").value == str({"resumed": False})
    assert [(n, k) for n, k, _ in steps(rid)] == [
        ("nap", "sleep"),
        ("approved", "fact_wait"),
        ("child", "child"),
        ("atomic", "function"),
        ("patch:v2", "patch"),
    ]


# -- what to write instead --------------------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # "coroutine ... was never awaited"
def test_a_step_call_never_awaited_fails_the_run_saying_await_it(fake_clock: FakeClock) -> None:
    @workflow(name="async_forgets_await")
    async def forgets(ctx: TaskContext) -> dict:
        ctx.step.run("fetch", lambda: 1)  # no await
        return {}

    rid = tasks_engine.enqueue("async_forgets_await", {}).run_id
    assert drain(fake_clock) == ["failed"]
    gc.collect()
    error = run(rid).error
    assert error["type"] == "builtins.TypeError"
    assert "ctx.step.run('fetch', ...) was never awaited" in error["message"]
    assert "write `await ctx.step.run('fetch', ...)`" in error["message"]
    assert steps(rid) == []


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_gathered_step_calls_fail_saying_one_at_a_time(fake_clock: FakeClock) -> None:
    @workflow(name="async_gathers")
    async def gathers(ctx: TaskContext) -> tuple:
        return await asyncio.gather(ctx.step.run("a", lambda: 1), ctx.step.run("b", lambda: 2))

    rid = tasks_engine.enqueue("async_gathers", {}).run_id
    assert drain(fake_clock) == ["failed"]
    gc.collect()
    message = run(rid).error["message"]
    assert "one at a time" in message and "await ctx.step.run('a', ...)" in message


def test_patched_used_as_a_bool_says_await_it(fake_clock: FakeClock) -> None:
    @workflow(name="async_patched_bool")
    async def patched_bool(ctx: AsyncTaskContext) -> bool:
        return bool(ctx.patched("x"))

    rid = tasks_engine.enqueue("async_patched_bool", {}).run_id
    assert drain(fake_clock) == ["failed"]
    assert "write `await ctx.patched('x')`" in run(rid).error["message"]


def test_an_async_function_in_an_atomic_step_is_refused_at_the_step(
    fake_clock: FakeClock,
) -> None:
    async def write() -> int:
        return 1

    @workflow(name="async_atomic_coroutine")
    async def atomic_coroutine(ctx: TaskContext) -> int:
        return await ctx.step.run("w", write, atomic=True)

    rid = tasks_engine.enqueue("async_atomic_coroutine", {}).run_id
    assert drain(fake_clock) == ["failed"]
    r = run(rid)
    assert r.error["type"] == "tasks_engine.exceptions.AsyncStepError"
    assert "atomic=True needs a plain function" in r.error["message"]
    assert steps(rid) == []  # refused before anything was recorded


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_plain_workflow_returning_a_coroutine_fails_saying_async_def(
    fake_clock: FakeClock,
) -> None:
    async def later() -> dict:
        return {}

    @workflow(name="plain_returns_coroutine")
    def returns_coroutine(ctx: TaskContext):
        return later()

    rid = tasks_engine.enqueue("plain_returns_coroutine", {}).run_id
    assert drain(fake_clock) == ["failed"]
    gc.collect()
    r = run(rid)
    assert r.error["type"] == "tasks_engine.exceptions.AsyncStepError"
    assert "define it with async def" in r.error["message"]


def test_an_async_generator_workflow_is_refused_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match="a workflow cannot be a generator"):

        @workflow(name="async_gen_flow")
        async def gen(ctx: TaskContext):
            yield 1

    assert registry.find("async_gen_flow", 1) is None


def test_an_async_step_error_is_a_type_error() -> None:
    assert issubclass(AsyncStepError, TypeError)


def test_the_workflow_tester_drives_an_async_run_its_timeout_cancelling_the_await(
    tmp_path,
) -> None:
    from tasks_engine.testing import WorkflowTester
    from tests.testapp.process_workflows import trace_lines

    with WorkflowTester() as tester:
        rid = tester.start("async_blocker", {"trace": str(tmp_path), "timeout": 0.2})
        view = tester.run_to_completion(rid)
    assert view.status == "failed"
    assert view.error["type"] == "tasks_engine.exceptions.StepTimeoutError"
    lines = trace_lines(tmp_path / f"{rid}.jsonl")
    assert [(r["event"], r.get("reason")) for r in lines] == [
        ("start", None),
        ("cancelled", "StepTimeoutError"),
    ]


def test_an_async_check_of_a_fact_wait_reads_business_rows(fake_clock: FakeClock) -> None:
    rid = tasks_engine.enqueue("async_checked", {}).run_id
    assert drain(fake_clock, horizon=0) == ["suspended"]
    Marker.objects.create(key=f"ready:{rid}")
    fake_clock.advance(5)
    assert drain(fake_clock, horizon=0) == ["completed"]
    assert run(rid).output is True


def test_a_database_error_in_an_async_runs_engine_write_is_an_outage(
    fake_clock: FakeClock, settings: Any
) -> None:
    """Not the run's failure: it unwinds the run (EngineUnavailable, which user code cannot
    catch), the run stays running for the worker to hand back, and it completes later. (The
    engine's statements through Django's cursors, where an execute wrapper sees them: not
    prepared on PostgreSQL.)"""
    settings.TASKS_ENGINE = {**settings.TASKS_ENGINE, "PREPARED_STATEMENTS": False}
    from django.db import OperationalError, connection

    from tasks_engine import transitions
    from tasks_engine.exceptions import EngineUnavailable
    from tasks_engine.runtime import executor

    rid = tasks_engine.enqueue("async_basic", {"sleep": 5}).run_id
    [c] = transitions.claim_runs("test-worker", [("async_basic", 1)], None, 1, 30.0)
    prepared = executor.prepare(c.run, c.lease, threading.Event(), c.prestarted)
    failed: list[str] = []

    def cut(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not failed and "waiting_on" in sql:  # the sleep parks the run
            failed.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(cut), pytest.raises(EngineUnavailable):
        executor.execute(c.run, prepared.workflow, prepared.ctx)
    assert failed and run(rid).status == "running"
    transitions.requeue_run(c.lease, fake_clock.now())
    assert drain(fake_clock) == ["suspended", "completed"]
    assert SideEffect.objects.filter(run_id=rid).count() == 1  # its steps were not run again


def test_replay_check_replays_an_async_workflows_history(fake_clock: FakeClock) -> None:
    """`tasks replay-check` awaits an async workflow's steps over its recorded history: a run
    waiting mid-way matches the code; a history the code no longer reaches is reported."""
    from tasks_engine.runtime import replay_check

    rid = tasks_engine.enqueue("async_full", {"sleep": 0}).run_id
    drain(fake_clock)
    assert run(rid).status == "waiting"
    assert replay_check.check("async_full") == (1, [])
    StepAttempt.objects.filter(run_id=rid, name="nap").update(name="renamed")
    checked, [mismatch] = replay_check.check("async_full")
    assert checked == 1
    assert "renamed" in mismatch.problem


@pytest.mark.one_db("no database: the abort signal and a closed event loop")
def test_an_abort_after_the_runs_loop_closed_does_not_raise() -> None:
    from tasks_engine.runtime.async_steps import _Cancel
    from tasks_engine.runtime.context import AbortSignal

    loop = asyncio.new_event_loop()
    signal = AbortSignal()
    signal.on_abort(_Cancel(loop).from_any_thread)
    loop.close()
    assert signal.abort(tasks_engine.TaskCanceledError("late"))  # the heartbeat's thread
