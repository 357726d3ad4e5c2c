"""OpenTelemetry spans, captured with the SDK's in-memory exporter, runs driven in-process."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from django.db import connection, transaction
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tasks_engine
from outbox import publish
from outbox.models import OutboxEvent
from outbox.relay import relay_once
from tasks_engine import LeaseLostError, testing, transitions
from tasks_engine.models import WorkflowRun
from tasks_engine.observe import tracing
from tasks_engine.runtime import executor
from tasks_engine.worker.group_commit import GroupCommit
from tasks_engine.worker.slots import SlotPool
from tests.helpers import FakeClock, drain

pytestmark = pytest.mark.django_db


class _Gate(SimpleSpanProcessor):
    """Exports only while a test of this module runs (the provider is process-wide)."""

    open = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.open:
            super().on_end(span)


_EXPORTER = InMemorySpanExporter()
_GATE = _Gate(_EXPORTER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_GATE)
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _GATE.open = True
    yield _EXPORTER
    _GATE.open = False
    _EXPORTER.clear()


def _named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_every_claim_of_a_run_shares_its_trace(spans: InMemorySpanExporter) -> None:
    with testing.WorkflowTester() as t:
        run = t.start("observe_nap")
        view = t.run_to_completion(run)
    assert view.status == "completed"
    claims = _named(spans, "workflow ")
    assert [c.name for c in claims] == ["workflow observe_nap", "workflow observe_nap"]
    assert {c.context.trace_id for c in claims} == {int(view.trace_id, 16)}
    assert [c.attributes["tasks.attempt"] for c in claims] == [1, 2]
    assert {c.attributes["tasks.run_id"] for c in claims} == {str(run)}
    assert [c.attributes["tasks.outcome"] for c in claims] == ["suspended", "completed"]
    assert all(c.parent is not None and c.parent.is_remote for c in claims)

    steps = _named(spans, "step ")
    # the sleep is the second claim's: the first one parked it (no span), the second ended it
    assert [s.name for s in steps] == ["step before", "step nap", "step after"]
    for step, claim, kind in zip(
        steps, [claims[0], claims[1], claims[1]], ["function", "sleep", "function"], strict=True
    ):
        assert step.context.trace_id == claim.context.trace_id
        assert step.parent is not None and step.parent.span_id == claim.context.span_id
        assert step.attributes["tasks.run_id"] == str(run)
        assert step.attributes["tasks.attempt"] == claim.attributes["tasks.attempt"]
        assert step.attributes["tasks.step.kind"] == kind
        assert step.attributes["tasks.step.status"] == "completed"
        assert step.start_time is not None and claim.start_time is not None
        assert step.end_time is not None and claim.end_time is not None
        assert claim.start_time <= step.start_time <= step.end_time <= claim.end_time


def test_a_failed_step_attempt_is_an_error_span(spans: InMemorySpanExporter) -> None:
    from tests.testapp import observe_workflows

    observe_workflows.ATTEMPTS.pop("traced", None)
    with testing.WorkflowTester() as t:
        run = t.start("observe_backoff", {"key": "traced", "failures": 1})
        t.run_to_completion(run)
    steps = _named(spans, "step call")
    assert [s.attributes["tasks.step.status"] for s in steps] == ["failed", "completed"]
    assert steps[0].status.status_code == trace.StatusCode.ERROR
    assert "attempt 1 failed" in (steps[0].status.description or "")
    assert len({s.context.trace_id for s in steps}) == 1


@pytest.mark.parametrize("pad", [0, 180])  # 180: the password straddles the 200-character cut
def test_a_failed_step_span_s_message_is_redacted_as_its_stored_error_is(
    spans: InMemorySpanExporter, pad: int
) -> None:
    """The span's status message is the step's error message, redacted as the stored error
    and the logs are (it went out as str(exc)[:200], credentials and all: an outside audit)."""
    with testing.WorkflowTester() as t:
        run = t.start("observe_secret_failure", {"pad": pad})
        view = t.run_to_completion(run)
    assert view.status == "failed"
    assert "spanpw" not in str(view.error)
    (step,) = _named(spans, "step connect")
    assert step.status.status_code == trace.StatusCode.ERROR
    description = step.status.description or ""
    assert description.startswith("x" * pad + " postgres://app:[red")
    assert "app:span" not in description and "spanpw" not in description
    assert len(description) <= 200


def test_waits_and_child_runs_make_one_span_each_when_they_end(
    spans: InMemorySpanExporter,
) -> None:
    with testing.WorkflowTester() as t:
        run = t.start("observe_acquire", {"plan_id": 1})
        t.run_until_idle()
        assert [s.name for s in _named(spans, "step ")] == ["step submit"]  # the wait parked
        t.signal(run, "download-done", {"size": 5})
        t.run_to_completion(run)
        timed_out = t.start("observe_fact_timeout")
        t.run_to_completion(timed_out)
        parent = t.start("parent_catches", {"value": 4, "fail": True})
        t.run_to_completion(parent)
    claims = {c.context.span_id: c for c in _named(spans, "workflow ")}
    steps = _named(spans, "step ")
    seen = [
        (
            s.name,
            s.attributes["tasks.step.kind"],
            s.attributes["tasks.step.status"],
            claims[s.parent.span_id].attributes["tasks.attempt"],  # type: ignore[union-attr]
        )
        for s in steps
    ]
    assert seen == [
        ("step submit", "function", "completed", 1),
        ("step download-done", "fact_wait", "completed", 2),
        ("step copy", "function", "completed", 2),
        ("step retention", "sleep", "completed", 3),
        ("step cleanup", "function", "completed", 3),
        ("step approval", "fact_wait", "failed", 2),
        ("step kid", "child", "failed", 2),
    ]
    by_name = {s.name: s for s in steps}
    assert by_name["step approval"].status.status_code == trace.StatusCode.ERROR
    assert "no fact 'approval' arrived" in (by_name["step approval"].status.description or "")
    assert by_name["step kid"].status.status_code == trace.StatusCode.ERROR
    assert by_name["step kid"].attributes["tasks.run_id"] == str(parent)
    assert by_name["step retention"].status.status_code == trace.StatusCode.UNSET


def test_a_run_enqueued_under_a_span_joins_its_trace(spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("test")
    with testing.WorkflowTester() as t:
        with tracer.start_as_current_span("request") as request:
            run = t.start("noop", {"n": 1})
        t.run_to_completion(run)
    expected = request.get_span_context().trace_id
    assert t.get_run(run).trace_id == trace.format_trace_id(expected)
    (claim,) = _named(spans, "workflow noop")
    assert claim.context.trace_id == expected


def test_outbox_carries_the_publishers_trace_into_the_route_s_runs(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("checkout") as caller, transaction.atomic():
        event = publish("test.enqueue_noop", {"n": 5})
    caller_trace = trace.format_trace_id(caller.get_span_context().trace_id)
    stored = OutboxEvent.objects.get(pk=event.pk).trace_context
    assert re.fullmatch(rf"00-{caller_trace}-[0-9a-f]{{16}}-[0-9a-f]{{2}}", stored)

    assert trace.get_current_span().get_span_context().is_valid is False  # relay: no span
    assert relay_once().dispatched == 1
    (run,) = tasks_engine.list_runs(task="noop")
    assert run.trace_id == caller_trace
    with testing.WorkflowTester() as t:
        t.run_to_completion(run.run_id)
    (claim,) = _named(spans, "workflow noop")
    assert trace.format_trace_id(claim.context.trace_id) == caller_trace


def test_without_a_current_span_runs_get_their_own_trace_ids() -> None:
    a = tasks_engine.enqueue("noop", {"n": 1}).run_id
    b = tasks_engine.enqueue("noop", {"n": 2}).run_id
    ids = {tasks_engine.get_run(a).trace_id, tasks_engine.get_run(b).trace_id}
    assert len(ids) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # The run's own id: nothing stored, so its row takes no entry in the trace id index.
    assert ids == {a.hex, b.hex}
    assert set(WorkflowRun.objects.filter(pk__in=[a, b]).values_list("trace_id", flat=True)) == {""}


def test_a_run_s_own_trace_id_is_the_trace_of_its_claims_and_its_children(
    spans: InMemorySpanExporter, fake_clock: FakeClock
) -> None:
    run = tasks_engine.enqueue("parent", {"value": 21}).run_id
    drain(fake_clock)
    assert tasks_engine.get_run(run).status == "completed"
    child = WorkflowRun.objects.get(parent_run_id=run)
    assert child.trace_id == run.hex  # stored: the parent's trace, which the child joined
    claims = [s for s in spans.get_finished_spans() if s.name.startswith("workflow ")]
    assert {c.context.trace_id for c in claims} == {int(run.hex, 16)}
    assert {c.attributes["tasks.run_id"] for c in claims} == {str(run), str(child.pk)}
    with transaction.atomic():
        event = publish("test.record", {"key": "untraced"})
    assert OutboxEvent.objects.get(pk=event.pk).trace_context == ""


def test_a_caller_s_own_trace_id_still_maps_to_one_trace() -> None:
    assert tracing.otel_trace_id("deploy-42") == tracing.otel_trace_id("deploy-42")
    assert tracing.otel_trace_id("deploy-42") != tracing.otel_trace_id("deploy-43")
    assert tracing.otel_trace_id("0" * 32) != 0
    assert tracing.otel_trace_id("ab" * 16) == int("ab" * 16, 16)


def test_spans_made_inside_a_step_body_nest_under_its_step(spans: InMemorySpanExporter) -> None:
    with testing.WorkflowTester() as t:
        assert t.run_to_completion(t.start("observe_inner_span")).status == "completed"
    [claim], [step], [inner] = (
        _named(spans, p) for p in ("workflow ", "step ", "GET /api/torrents")
    )
    assert step.parent is not None and step.parent.span_id == claim.context.span_id
    assert inner.parent is not None and inner.parent.span_id == step.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # the step's span left no trace here


# -- a claim's span tells what its completion wrote -------------------------------------------


def test_a_completion_a_cancel_beat_ends_its_claim_span_canceled(
    spans: InMemorySpanExporter, fake_clock: FakeClock
) -> None:
    """The completion reports the status it wrote (a cancel committed as the handler returned:
    "canceled"); the claim's span said "completed" whatever was written."""
    rid = tasks_engine.enqueue("canceled_as_it_returns").run_id
    assert drain(fake_clock, horizon=0) == ["completed"]  # what the handler's return says
    assert WorkflowRun.objects.get(pk=rid).status == "canceled"
    (claim,) = _named(spans, "workflow ")
    assert claim.attributes["tasks.outcome"] == "canceled"
    assert claim.status.status_code == trace.StatusCode.UNSET


class _HeldWriter:
    """A worker's group writer, for the run's last write: handed off, written later (after
    the slot moved on), or dropped."""

    def __init__(self) -> None:
        self.held: list[transitions.HotWrite] = []

    def send(self, write: transitions.HotWrite) -> None:
        transitions.write_alone(write)

    def hand_off(self, write: transitions.HotWrite) -> None:
        write.detached = True
        self.held.append(write)


def _execute_held(task: str, input: Any = None) -> tuple[str, transitions.HotWrite]:
    tasks_engine.enqueue(task, input)
    [c] = transitions.claim_runs("w", [(task, 1)], None, 1, 30)
    writer = _HeldWriter()
    lease = dataclasses.replace(c.lease, writer=writer)
    prepared = executor.prepare(c.run, lease, threading.Event(), c.prestarted)
    outcome = executor.execute(c.run, prepared.workflow, prepared.ctx)
    [write] = writer.held
    return outcome, write


@pytest.mark.django_db(transaction=True)  # outside a transaction: the lease's writer is used
def test_a_detached_completion_ends_its_claim_span_once_written(
    spans: InMemorySpanExporter,
) -> None:
    outcome, write = _execute_held("canceled_as_it_returns")
    assert outcome == "completed"
    assert _named(spans, "workflow ") == []  # not ended: what the write does is not known yet
    transitions.write_alone(write)  # the group writer, after the slot moved on
    (claim,) = _named(spans, "workflow ")
    assert claim.attributes["tasks.outcome"] == "canceled"


@pytest.mark.django_db(transaction=True)
def test_a_detached_completion_that_is_dropped_still_ends_its_claim_span(
    spans: InMemorySpanExporter,
) -> None:
    _, write = _execute_held("noop", {"n": 1})
    write.error = LeaseLostError("gone")
    write.dropped()  # what the group writer does with a detached write that failed
    (claim,) = _named(spans, "workflow ")
    assert "tasks.outcome" not in (claim.attributes or {})


@pytest.mark.django_db(transaction=True)
def test_the_claim_spans_of_the_writes_a_dying_group_writer_held_still_end(
    spans: InMemorySpanExporter,
) -> None:
    """The group writer's log stream breaks (stderr a pipe whose reader exited): its warning
    about a fenced completion raised, the thread died, and the claim spans of the handed-off
    completions it held (the rest of its group, its queue) were never ended. Each ends now,
    with no outcome (one written before the death keeps its own)."""
    if connection.vendor != "postgresql":
        pytest.skip("group commit needs data-modifying CTEs (PostgreSQL)")
    held = [_execute_held("noop", {"n": n})[1] for n in range(3)]
    fenced = [w.lease.run_id for w in held[:2]]  # their leases were lost: the fence refuses them
    WorkflowRun.objects.filter(pk__in=fenced).update(lease_token=None, status="pending")
    reader, writer_end = os.pipe()
    os.close(reader)
    stream = os.fdopen(writer_end, "w")
    log = structlog.wrap_logger(
        structlog.PrintLogger(stream), processors=[structlog.processors.KeyValueRenderer()]
    )
    slots = SlotPool(concurrency=3, prefetch=0)
    slots.reserve(3)  # the slots the three runs handed over with their completions
    claims = transitions.ClaimRequest("w", [("noop", 1)], None, 0, 30)
    group = GroupCommit(slots, claims, log)
    for write in held:  # as hand_off queues them: detached, nobody waits
        group._queue.put((write, None))
    group._queue.put(None)  # nothing comes after them
    try:
        group.start()
        group.join(10)
    finally:
        with contextlib.suppress(OSError):
            stream.close()
    assert not group.is_alive() and group.dead
    ended = {c.attributes["tasks.run_id"]: c for c in _named(spans, "workflow ")}
    assert set(ended) == {str(w.lease.run_id) for w in held}
    for run_id in fenced:
        assert "tasks.outcome" not in (ended[str(run_id)].attributes or {})
    assert ended[str(held[2].lease.run_id)].attributes["tasks.outcome"] == "completed"
    assert slots.busy() == 0
