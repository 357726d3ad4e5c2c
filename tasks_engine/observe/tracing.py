"""OpenTelemetry spans, when `opentelemetry-api` is installed and a tracer provider is set.

- `workflow <task>`: one span per claim (one execution of the handler), parented on a remote
  span context made from the run's `trace_id`, so every claim of a run, on any worker, joins
  the same trace. `enqueue` stores the caller's trace id as the run's `trace_id` when a span
  is current (else the run's trace id is its own id), so a run joins the trace of whoever
  started it.
- `step <name>`: one span per executed step attempt (function, sleep, fact wait, child run),
  a child of its claim's span; a wait's span is made by the claim that resolves it
  (runtime/step_observer.py).
- The outbox stores the publisher's trace context (W3C `traceparent`) on the event, and the
  relay makes it current around the route, so the runs a route enqueues join that trace.

Without the package every function here is a constant-time no-op; with it but without a
provider, only the trace id propagation works (no span is made).
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]

INSTRUMENTATION = "tasks_engine"


def _tracer() -> Any:
    """The tracer, or None when no real provider is set (the API's default does nothing)."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(INSTRUMENTATION)


def new_trace_id() -> str:
    """The trace id `enqueue` stores for a run: the current span's (32 hex digits, W3C) if
    there is one, else "": the run's trace id is then its own id (`run_trace_id`), and its row
    takes no entry in the trace id index (each of a run's writes, insert, claim and completion,
    would add one; a drain measured 1.01 to 1.04x faster without them)."""
    if trace is not None:
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            return trace.format_trace_id(span_context.trace_id)
    return ""


def run_trace_id(stored: str, run_id: uuid.UUID | str) -> str:
    """A run's trace id: the one stored with it (a caller's, or the span current at enqueue),
    else its own id as 32 hex digits: unique, as a W3C trace id must be (a version 7 id starts
    with its creation time, as AWS X-Ray's trace ids do; its last 16 digits, the span id
    `_run_parent` derives, are a counter seeded at random and 32 random bits)."""
    if stored:
        return stored
    return run_id.hex if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id)).hex


def otel_trace_id(trace_id: str) -> int:
    """The OpenTelemetry trace id of a run: its trace_id when that is 32 hex digits (what
    enqueue stores), else derived from it (a caller's own string) by hashing."""
    try:
        value = int(trace_id, 16) if len(trace_id) == 32 else 0
    except ValueError:
        value = 0
    if value == 0:
        value = int(hashlib.sha256(trace_id.encode()).hexdigest()[:32], 16) or 1
    return value


def _run_parent(trace_id: str) -> Any:
    """A remote parent for a run's claim spans: same trace id for every claim; the span id is
    derived from it (a stand-in for the enqueue, which made no span of its own)."""
    tid = otel_trace_id(trace_id)
    span_id = (tid & 0xFFFFFFFFFFFFFFFF) or 1
    parent = trace.SpanContext(
        trace_id=tid,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


@contextlib.contextmanager
def claim_span(ctx: Any) -> Iterator[Any]:
    """The span of one claim of a run, current while the handler runs (None: no tracing).
    Leaving the block does not end it: `end_claim` does, once the claim's outcome is known
    (a completion's once written, which a detached write reports after the slot moved on)."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    attributes = {
        "tasks.run_id": str(ctx.run_id),
        "tasks.task": ctx.task_name,
        "tasks.version": ctx.version,
        "tasks.queue": ctx.queue,
        "tasks.attempt": ctx.attempt,
    }
    with tracer.start_as_current_span(
        f"workflow {ctx.task_name}",
        context=_run_parent(ctx.trace_id or ""),
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
        end_on_exit=False,
    ) as span:
        yield span


def start_step_span(ctx: Any, key: str, kind: str, start_time: int | None = None) -> Any:
    """Start the span of an executed step under the claim's span (None: no tracing);
    `start_time` (ns since the epoch) when it began earlier (runtime/step_observer.py makes the span
    once the attempt has ended)."""
    if ctx._state.span is None:
        return None
    tracer = _tracer()
    if tracer is None:
        return None
    return tracer.start_span(
        f"step {key}",
        attributes={
            "tasks.run_id": str(ctx.run_id),
            "tasks.attempt": ctx.attempt,
            "tasks.step.name": key,
            "tasks.step.kind": str(kind),  # a StepKind is a str enum: its value, not its repr
        },
        start_time=start_time,
    )


def make_current(span: Any) -> Any:
    """Make `span` the current span of this thread; returns the token `stop_current` takes."""
    if span is None:
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def stop_current(token: Any) -> None:
    otel_context.detach(token)


def end_step_span(span: Any, status: str, message: str | None) -> None:
    """End a step's span; a failed one gets status ERROR with `message` (the error's message,
    redacted by the caller as the stored error is: runtime/step_observer.py)."""
    span.set_attribute("tasks.step.status", str(status))
    if status == "failed" and message is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, message[:200]))
    span.end()


def end_claim(span: Any, outcome: str | None) -> None:
    """End a claim's span with its outcome (None: none to tell: the claim raised, or its
    detached completion failed). Only the first call counts: an ended span is left as it is."""
    if span is None or not span.is_recording():
        return
    if outcome is not None:
        span.set_attribute("tasks.outcome", outcome)
        if outcome == "failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR))
    span.end()


# -- carrying a trace through the outbox -------------------------------------------------------


def current_trace_context() -> str:
    """The caller's span as a W3C traceparent ("" when no span is current)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


@contextlib.contextmanager
def trace_context_activated(traceparent: str) -> Iterator[None]:
    """Make a stored traceparent current (runs enqueued inside join that trace)."""
    if trace is None or not traceparent:
        yield
        return
    extracted = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    token = otel_context.attach(extracted)
    try:
        yield
    finally:
        otel_context.detach(token)
