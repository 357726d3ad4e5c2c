"""Workflows for the testing harness, metrics and tracing tests: days-long timers and backoffs
that only a fake clock gets through in a test."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from tasks_engine import FactTimeoutError, RetryPolicy, TaskContext, workflow

ATTEMPTS: dict[str, int] = {}  # per key: calls of the failing step in this process


class Plan(BaseModel):
    plan_id: int


@workflow(name="observe_acquire", input=Plan)
def observe_acquire(ctx: TaskContext) -> dict:
    """The shape of UMT's acquire: submit, wait for the download, copy, keep a week, clean."""
    sub = ctx.step.run("submit", lambda: {"path": f"/downloads/{ctx.input.plan_id}"})
    done = ctx.step.wait_for_fact("download-done", timeout=timedelta(days=7))
    ctx.step.run("copy", lambda: {"from": sub["path"], "size": done["size"]})
    ctx.step.sleep("retention", timedelta(days=7))
    ctx.step.run("cleanup", lambda: True)
    return {"ok": True, "size": done["size"]}


@workflow(name="observe_fact_timeout")
def observe_fact_timeout(ctx: TaskContext) -> str:
    try:
        ctx.step.wait_for_fact("approval", timeout=timedelta(hours=12))
    except FactTimeoutError:
        return "timed out"
    return "approved"


class Flaky(BaseModel):
    key: str
    failures: int


@workflow(
    name="observe_backoff",
    input=Flaky,
    step_retry=RetryPolicy(max_attempts=5, initial_interval=600.0, max_interval=3600.0),
)
def observe_backoff(ctx: TaskContext) -> int:
    """A step that fails `failures` times, each retry after a backoff of ten minutes or more."""

    def body() -> int:
        n = ATTEMPTS[ctx.input.key] = ATTEMPTS.get(ctx.input.key, 0) + 1
        if n <= ctx.input.failures:
            raise ConnectionError(f"attempt {n} failed")
        return n

    return ctx.step.run("call", body)


@workflow(name="observe_nap")
def observe_nap(ctx: TaskContext) -> str:
    """Two claims: one before the sleep, one after it."""
    ctx.step.run("before", lambda: 1)
    ctx.step.sleep("nap", 30)
    ctx.step.run("after", lambda: 2)
    return "rested"


@workflow(name="observe_inner_span")
def observe_inner_span(ctx: TaskContext) -> str:
    """A step whose body makes a span of its own, as an instrumented HTTP client would."""

    def fetch() -> str:
        from opentelemetry import trace

        with trace.get_tracer("tests.http").start_as_current_span("GET /api/torrents"):
            return "fetched"

    return ctx.step.run("fetch", fetch)


class Pad(BaseModel):
    pad: int


@workflow(name="observe_secret_failure", input=Pad, step_retry=RetryPolicy(max_attempts=1))
def observe_secret_failure(ctx: TaskContext) -> None:
    """A step whose error message carries credentials (a driver's connection error, say),
    after `pad` characters."""

    def connect() -> None:
        pad = "x" * ctx.input.pad
        raise ConnectionError(f"{pad} postgres://app:spanpwsecret@db/x?password=spanpw2 refused")

    ctx.step.run("connect", connect)
