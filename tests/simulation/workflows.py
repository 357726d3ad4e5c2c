"""The simulation's workflows (`sim-...`) and what each must end with.

They are registered only while the simulation runs (`registered()`), so the rest of the suite
never sees them. Every step body logs its start in the side-effect log and stops there (the
step is in flight) until the machine releases it; its result is the previous result plus its
own name, so a completed run's output says which steps ran, in which order, with which facts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from tasks_engine import (
    AsyncTaskContext,
    FactTimeoutError,
    NonRetryableError,
    RetryPolicy,
    StepTimeoutError,
    TaskContext,
)
from tasks_engine.definitions import Workflow, registry, workflow
from tests.testapp.models import Marker

from . import harness

FACT = "go"
FACT_PAYLOAD = "!"
SLEEP_SECONDS = 10.0
FACT_TIMEOUT_SECONDS = 20.0
STEP_RETRY = RetryPolicy(max_attempts=3, initial_interval=1.0, max_interval=4.0)
SIM_KEY = "sim-disk"  # sim-keyed's concurrency key
QUEUEING_KEY = "sim-scan"  # the "queued" shape's queueing key (machine.py)
KEY_LIMIT = 1
# Debounce, on_limit and rate limits per key (issue 46): sim-debounced's key and window,
# sim-cancel-new's and sim-cancel-running's concurrency keys (limit 1), sim-rated's key and
# rate (RATE_COUNT claims per RATE_WINDOW seconds).
DEBOUNCE_KEY = "sim-window"
DEBOUNCE_SECONDS = 5.0
DEBOUNCE_MAX_SECONDS = 12.0
CANCEL_NEW_KEY = "sim-new"
CANCEL_RUNNING_KEY = "sim-old"
RATE_KEY = "sim-rate"
RATE_COUNT = 2
RATE_WINDOW = 60.0
NARROW_QUEUE = "sim-narrow"  # sim-narrow's queue: at most NARROW_LIMIT of its runs running
NARROW_LIMIT = 1
# sim-timed's step "t": its timeout (the machine's clock moves by 0.6, 5, 11 and 31 s) and its
# retry policy (a timed-out attempt is retried once, then StepTimeoutError reaches the workflow).
TIMEOUT_SECONDS = 8.0
TIMED_RETRY = RetryPolicy(max_attempts=2, initial_interval=1.0, max_interval=1.0)
SLOW_SECONDS = TIMEOUT_SECONDS + 1
# sim-deadline's `@workflow(deadline=...)`: created + this; its sleep alone nearly uses it up.
DEADLINE_SECONDS = 25.0


class SimFailure(NonRetryableError):
    """A workflow's deliberate failure."""


class ChildFlake(Exception):
    """A child's deliberate first failure: retryable at the parent's workflow level."""


class SimInput(BaseModel):
    atomic: bool = False  # step "b" is atomic=True
    honor_abort: bool = False  # bodies raise on ctx.abort_signal after their stop
    op: str = ""  # op key of sim-op; empty: one of its own
    bad: str = "nan"  # sim-bad-value: nan | inf | nul | set
    # Step bodies (by key, each a letter) whose first runs take SLOW_SECONDS by the fake clock
    # (as many runs as the key's letter appears): past TIMEOUT_SECONDS, two past a 12 s deadline.
    slow: str = ""


class ChildOnceInput(BaseModel):
    parent: str


# -- step bodies ------------------------------------------------------------------------------


def _slow(ctx: TaskContext, key: str) -> float:
    """Seconds the body `key` takes now (by the fake clock): SimInput.slow says."""
    runs = str(getattr(ctx.input, "slow", "")).count(key)
    return SLOW_SECONDS if harness.LOG.count(ctx.run_id, key) < runs else 0.0


def step(ctx: TaskContext, key: str, prev: str = "", *, atomic: bool = False) -> str:
    honor_abort = bool(getattr(ctx.input, "honor_abort", False))

    def body() -> str:
        harness.executed(ctx, key, slow=_slow(ctx, key))
        if honor_abort:
            ctx.raise_if_canceled()
        return prev + key

    return str(ctx.step.run(key, body, atomic=atomic))


def _timed_body(ctx: TaskContext) -> str:
    """sim-timed's step "t": an atomic one writes a business row (a Marker) with its checkpoint."""
    step_id = harness.executed(ctx, "t", timeout=TIMEOUT_SECONDS, slow=_slow(ctx, "t"))
    if ctx.input.honor_abort:
        ctx.raise_if_canceled()  # the timeout's abort too: the attempt fails with it
    if ctx.input.atomic and step_id is not None:
        Marker.objects.create(key=harness.business_key(step_id), value=str(ctx.run_id))
    return "t"


def _op_body(ctx: TaskContext, op_key: str) -> str:
    harness.op_executed(ctx, op_key)
    return "op"


def _flaky_body(ctx: TaskContext) -> str:
    harness.executed(ctx, "a")
    if harness.LOG.count(ctx.run_id, "a") == 1:
        raise ValueError("the first try of a flaky step fails")
    return "a"


def _boom(ctx: TaskContext) -> None:
    harness.executed(ctx, "boom")
    raise SimFailure("deliberate failure")


def _child_once_body(ctx: TaskContext) -> str:
    harness.executed(ctx, "a")
    parent = ctx.input.parent
    if parent not in harness.LOG.flaked_children:
        harness.LOG.flaked_children.add(parent)
        raise ChildFlake(f"first child of {parent} fails")
    return "a"


BAD_VALUES: dict[str, Callable[[], Any]] = {
    "nan": lambda: float("nan"),
    "inf": lambda: float("inf"),
    "nul": lambda: "a\x00b",
    "set": lambda: {1, 2},
}


def _bad_body(ctx: TaskContext) -> Any:
    harness.executed(ctx, "a")
    return BAD_VALUES[ctx.input.bad]()


# -- workflows --------------------------------------------------------------------------------


async def astep(ctx: TaskContext, key: str, prev: str = "", *, atomic: bool = False) -> str:
    """`step` in an async workflow: awaited; its body a plain function, so it runs off the
    run's event loop, on the thread that executes the claim (harness.current_attempt)."""
    honor_abort = bool(getattr(ctx.input, "honor_abort", False))

    def body() -> str:
        harness.executed(ctx, key, slow=_slow(ctx, key))
        if honor_abort:
            ctx.raise_if_canceled()
        return prev + key

    return str(await ctx.step.run(key, body, atomic=atomic))


async def sim_async_steps(ctx: AsyncTaskContext) -> str:
    a = await astep(ctx, "a")
    b = await astep(ctx, "b", a, atomic=ctx.input.atomic)
    return await astep(ctx, "c", b)


async def sim_async_fact(ctx: AsyncTaskContext) -> str:
    a = await astep(ctx, "a")
    await ctx.step.sleep("nap", SLEEP_SECONDS)
    got = await ctx.step.wait_for_fact(FACT)
    return await astep(ctx, "b", a + str(got))


def sim_steps(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    b = step(ctx, "b", a, atomic=ctx.input.atomic)
    return step(ctx, "c", b)


def sim_sleep(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    ctx.step.sleep("nap", SLEEP_SECONDS)
    return step(ctx, "b", a)


def sim_fact(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    got = ctx.step.wait_for_fact(FACT)
    return step(ctx, "b", a + str(got))


def sim_fact_timeout(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    try:
        got = str(ctx.step.wait_for_fact(FACT, timeout=FACT_TIMEOUT_SECONDS))
    except FactTimeoutError:
        got = "T"
    return step(ctx, "b", a + got)


def sim_parent(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    kid = ctx.step.run_child("sim-steps", {}, name="kid")
    return step(ctx, "b", a + str(kid))


def sim_op(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    op_key = ctx.input.op or f"op-{ctx.run_id}"
    result = ctx.with_attempt_token(
        op_key,
        lambda info: _op_body(ctx, op_key),
        commit=lambda result: harness.op_committed(ctx, op_key),
    )
    return step(ctx, "b", a + str(result))


def sim_timed(ctx: TaskContext) -> str:
    """A step with a timeout (atomic, honoring its abort, as the input says): each timed-out
    attempt is retried under TIMED_RETRY, then the workflow catches the StepTimeoutError."""
    a = step(ctx, "a")
    try:
        t = ctx.step.run(
            "t",
            lambda: _timed_body(ctx),
            atomic=ctx.input.atomic,
            timeout=TIMEOUT_SECONDS,
            retry=TIMED_RETRY,
        )
    except StepTimeoutError:
        t = "T"
    return step(ctx, "b", a + str(t))


def sim_deadline(ctx: TaskContext) -> str:
    """A run with a deadline (`@workflow(deadline=...)`) that a few clock moves pass mid-run."""
    a = step(ctx, "a")
    ctx.step.sleep("nap", SLEEP_SECONDS)
    b = step(ctx, "b", a)
    return step(ctx, "c", b)


def sim_flaky(ctx: TaskContext) -> str:
    a = str(ctx.step.run("a", lambda: _flaky_body(ctx)))
    return step(ctx, "b", a)


def sim_fail(ctx: TaskContext) -> str:
    step(ctx, "a")
    ctx.step.run("boom", lambda: _boom(ctx))
    raise AssertionError("unreachable: boom raises")


def sim_child_once(ctx: TaskContext) -> str:
    return str(ctx.step.run("a", lambda: _child_once_body(ctx), retry=RetryPolicy(max_attempts=1)))


def sim_parent_retry(ctx: TaskContext) -> str:
    kid = ctx.step.run_child("sim-child-once", {"parent": str(ctx.run_id)}, name="kid")
    return step(ctx, "b", str(kid))


def sim_keyed(ctx: TaskContext) -> str:
    """Flow control: at most KEY_LIMIT runs of its key run at once, fleet-wide; its sleep
    (a waiting run) holds no place."""
    a = step(ctx, "a")
    ctx.step.sleep("nap", SLEEP_SECONDS)
    return step(ctx, "b", a)


def sim_narrow(ctx: TaskContext) -> str:
    """Flow control by queue: at most NARROW_LIMIT runs of its queue run at once, fleet-wide;
    its sleep (a waiting run) holds no place."""
    a = step(ctx, "a")
    ctx.step.sleep("nap", SLEEP_SECONDS)
    return step(ctx, "b", a)


def _two_steps_and_a_nap(ctx: TaskContext) -> str:
    a = step(ctx, "a")
    ctx.step.sleep("nap", SLEEP_SECONDS)
    return step(ctx, "b", a)


def sim_debounced(ctx: TaskContext) -> str:
    """Debounce: its enqueues inside the window collapse into one queued run."""
    return _two_steps_and_a_nap(ctx)


def sim_cancel_new(ctx: TaskContext) -> str:
    """on_limit="cancel_new": an enqueue while its key holds a run ends canceled at once."""
    return _two_steps_and_a_nap(ctx)


def sim_cancel_running(ctx: TaskContext) -> str:
    """on_limit="cancel_running": an enqueue cancels the key's run and takes its place."""
    return _two_steps_and_a_nap(ctx)


def sim_rated(ctx: TaskContext) -> str:
    """A rate limit per key: at most RATE_COUNT claims of its key per RATE_WINDOW seconds."""
    return _two_steps_and_a_nap(ctx)


def sim_bad_value(ctx: TaskContext) -> Any:
    return ctx.step.run("a", lambda: _bad_body(ctx))


# -- what each must end with ------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """How a run of this workflow may end (besides canceled, and besides the failures every
    run may meet: see invariants.allowed_failure)."""

    outputs: frozenset[str] = frozenset()  # completed with one of these
    steps: tuple[str, ...] = ()  # function steps a completed run completed exactly once
    fails_with: tuple[str, ...] = ()  # error types (qualified names) of its deliberate failures
    must_fail: bool = False  # it never completes
    run_once: tuple[str, ...] = ()  # step bodies that may start only once, whatever happens


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


DEFINITIONS: list[tuple[Callable[..., Any], dict[str, Any], Expect]] = [
    (sim_steps, {"input": SimInput}, Expect(frozenset({"abc"}), ("a", "b", "c"))),
    (sim_async_steps, {"input": SimInput}, Expect(frozenset({"abc"}), ("a", "b", "c"))),
    (sim_async_fact, {}, Expect(frozenset({"a!b"}), ("a", "b"))),
    (sim_sleep, {}, Expect(frozenset({"ab"}), ("a", "b"))),
    (sim_fact, {}, Expect(frozenset({"a!b"}), ("a", "b"))),
    (sim_fact_timeout, {}, Expect(frozenset({"a!b", "aTb"}), ("a", "b"))),
    (sim_parent, {}, Expect(frozenset({"aabcb"}), ("a", "b"))),
    (sim_op, {"input": SimInput}, Expect(frozenset({"aopb"}), ("a", "b"))),
    (sim_timed, {"input": SimInput}, Expect(frozenset({"atb", "aTb"}), ("a", "b"))),
    (
        sim_deadline,
        {"deadline": timedelta(seconds=DEADLINE_SECONDS)},
        Expect(frozenset({"abc"}), ("a", "b", "c")),
    ),
    (sim_flaky, {"step_retry": STEP_RETRY}, Expect(frozenset({"ab"}), ("a", "b"))),
    (sim_fail, {}, Expect(fails_with=(_name(SimFailure),), must_fail=True, run_once=("boom",))),
    (
        sim_child_once,
        {"input": ChildOnceInput},
        Expect(frozenset({"a"}), ("a",), fails_with=(_name(ChildFlake),)),
    ),
    (
        sim_parent_retry,
        {"retry": RetryPolicy(max_attempts=2, initial_interval=1.0)},
        Expect(frozenset({"ab"}), ("b",)),
    ),
    (sim_bad_value, {"input": SimInput}, Expect(must_fail=True, run_once=("a",))),
    (
        sim_keyed,
        {"concurrency_key": SIM_KEY, "concurrency_limit": KEY_LIMIT},
        Expect(frozenset({"ab"}), ("a", "b")),
    ),
    (sim_narrow, {"queue": NARROW_QUEUE}, Expect(frozenset({"ab"}), ("a", "b"))),
    (
        sim_debounced,
        {
            "input": SimInput,
            "debounce": timedelta(seconds=DEBOUNCE_SECONDS),
            "debounce_key": DEBOUNCE_KEY,
            "debounce_max": timedelta(seconds=DEBOUNCE_MAX_SECONDS),
        },
        Expect(frozenset({"ab"}), ("a", "b")),
    ),
    (
        sim_cancel_new,
        {"concurrency_key": CANCEL_NEW_KEY, "on_limit": "cancel_new"},
        Expect(frozenset({"ab"}), ("a", "b")),
    ),
    (
        sim_cancel_running,
        {"concurrency_key": CANCEL_RUNNING_KEY, "on_limit": "cancel_running"},
        Expect(frozenset({"ab"}), ("a", "b")),
    ),
    (
        sim_rated,
        {"rate_limit": f"{RATE_COUNT}/m", "rate_limit_key": RATE_KEY},
        Expect(frozenset({"ab"}), ("a", "b")),
    ),
]


def _task_name(fn: Callable[..., Any]) -> str:
    return fn.__name__.replace("_", "-")


EXPECT: dict[str, Expect] = {_task_name(fn): expect for fn, _, expect in DEFINITIONS}
_WORKFLOWS: list[Workflow] = []


@contextlib.contextmanager
def registered() -> Iterator[list[tuple[str, int]]]:
    """Register the sim workflows for the duration; yields their (name, version) pairs."""
    if not _WORKFLOWS:
        for fn, options, _ in DEFINITIONS:
            wf = workflow(fn, name=_task_name(fn), **options)
            registry.unregister(wf.name, wf.version)
            _WORKFLOWS.append(wf)
    for wf in _WORKFLOWS:
        registry.register(wf)
    try:
        yield sorted((wf.name, wf.version) for wf in _WORKFLOWS)
    finally:
        for wf in _WORKFLOWS:
            registry.unregister(wf.name, wf.version)
