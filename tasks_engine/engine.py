"""The engine API: enqueue, signal, cancel, get_run, list_runs. Thin; transitions do the writes."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from . import clock, notify, tracing, transitions
from .definitions import Workflow, registry
from .exceptions import IdempotencyConflict, UnknownRunError
from .models import Fact, StepAttempt, WorkflowRun
from .serialization import input_hash, to_jsonable
from .states import FINISHED, RunStatus


@dataclass(frozen=True)
class Enqueued:
    run_id: uuid.UUID
    deduplicated: bool


@dataclass(frozen=True)
class Signaled:
    delivered: bool
    status: str


@dataclass(frozen=True)
class StepView:
    name: str
    kind: str
    status: str
    attempt: int
    output: Any
    error: Any
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class RunView:
    run_id: uuid.UUID
    task_name: str
    version: int
    queue: str
    status: str
    attempts: int
    priority: int
    idempotency_key: str | None
    trace_id: str
    input: Any
    output: Any
    error: Any
    cancel_requested_at: datetime | None
    cancel_reason: str
    available_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    parent_run_id: uuid.UUID | None
    progress: Any
    unreached_steps: list[str]
    concurrency_key: str | None = None
    waiting_on: str = ""
    steps: list[StepView] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: UUIDs and times as strings."""
        return _jsonable(asdict(self))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _view(run: WorkflowRun, steps: list[StepView] | None = None) -> RunView:
    return RunView(
        run_id=run.pk,
        task_name=run.task_name,
        version=run.version,
        queue=run.queue,
        status=run.status,
        attempts=run.attempts,
        priority=run.priority,
        idempotency_key=run.idempotency_key,
        trace_id=run.trace_id,
        input=run.input,
        output=run.output,
        error=run.error,
        cancel_requested_at=run.cancel_requested_at,
        cancel_reason=run.cancel_reason,
        available_at=run.available_at,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        parent_run_id=run.parent_run_id,
        progress=run.progress,
        unreached_steps=list(run.unreached_steps or []),
        concurrency_key=run.concurrency_key,
        waiting_on=run.waiting_on,
        steps=steps or [],
    )


def _run_id(run_id: uuid.UUID | str) -> uuid.UUID:
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise UnknownRunError(f"no run with id {run_id!r} (not a UUID)") from None


def enqueue(
    task: str | Workflow,
    input: Any = None,
    *,
    version: int | None = None,
    idempotency_key: str | None = None,
    priority: int | None = None,
    available_at: datetime | None = None,
    deadline_at: datetime | None = None,
    trace_id: str | None = None,
    queue: str | None = None,
    concurrency_key: str | None = None,
    parent_run_id: uuid.UUID | None = None,
    parent_step: str = "",
) -> Enqueued:
    """Create a run on the caller's connection: it commits or rolls back with the caller.
    `concurrency_key` overrides the workflow's key (docs/FLOW_CONTROL.md)."""
    if isinstance(task, Workflow):
        version = version or task.version
        task = task.name
    wf = registry.get(task, version)
    data = wf.validate_input(input)  # pydantic.ValidationError: nothing written
    key = wf.key_for(data, concurrency_key)  # ValueError: nothing written
    digest = input_hash(data)
    run_id = transitions.create_run(
        task_name=wf.name,
        version=wf.version,
        queue=queue or wf.queue,
        priority=wf.priority if priority is None else priority,
        input=data,
        idempotency_key=idempotency_key,
        input_hash=digest,
        trace_id=trace_id or tracing.new_trace_id(),
        available_at=available_at,
        deadline_at=deadline_at if deadline_at is not None else _default_deadline(wf),
        parent_run_id=parent_run_id,
        parent_step=parent_step,
        concurrency_key=key,
        concurrency_limit=wf.concurrency_limit if key is not None else None,
    )
    if run_id is None:  # the idempotency key is taken: same input -> that run, else conflict
        assert idempotency_key is not None
        found = _existing(wf.name, idempotency_key, digest)
        assert found is not None
        return found
    return Enqueued(run_id, False)


def _default_deadline(wf: Workflow) -> datetime | None:
    return clock.now() + wf.deadline if wf.deadline is not None else None


def _existing(task_name: str, key: str, digest: str) -> Enqueued | None:
    row = (
        WorkflowRun.objects.filter(task_name=task_name, idempotency_key=key)
        .values_list("pk", "input_hash")
        .first()
    )
    if row is None:
        return None
    if row[1] != digest:
        raise IdempotencyConflict(
            f"idempotency key {key!r} of task {task_name!r} is taken by run {row[0]} "
            "with a different input"
        )
    return Enqueued(row[0], True)


def get_run(run_id: uuid.UUID | str) -> RunView | None:
    try:
        rid = _run_id(run_id)
    except UnknownRunError:
        return None
    run = WorkflowRun.objects.filter(pk=rid).first()
    if run is None:
        return None
    steps = [
        StepView(
            s.name, s.kind, s.status, s.attempt, s.output, s.error, s.started_at, s.finished_at
        )
        for s in StepAttempt.objects.filter(run_id=rid).order_by("id")
    ]
    return _view(run, steps)


def list_runs(
    *, task: str | None = None, status: str | None = None, limit: int = 50
) -> list[RunView]:
    if status is not None and status not in RunStatus.values:
        raise ValueError(f"unknown status {status!r}; one of {', '.join(RunStatus.values)}")
    qs = WorkflowRun.objects.all().order_by("-created_at")
    if task is not None:
        qs = qs.filter(task_name=task)
    if status is not None:
        qs = qs.filter(status=status)
    return [_view(run) for run in qs[: max(int(limit), 0)]]


def cancel(run_id: uuid.UUID | str, reason: str | None = None) -> bool:
    """Cancel a run and its children. False when the run had already finished."""
    rid = _run_id(run_id)
    with transaction.atomic():
        transitions.lock_parent(rid)  # a parent parking on this run must see the cancel
        run = WorkflowRun.objects.select_for_update().filter(pk=rid).first()
        if run is None:
            raise UnknownRunError(f"no run with id {rid}")
        if run.status in FINISHED:
            return False
        transitions.cancel_active(run, reason or "")
    return True


def signal(run_id: uuid.UUID | str, name: str, payload: Any = None) -> Signaled:
    """Store a fact for the run and wake it if it waits on that name."""
    rid = _run_id(run_id)
    data = to_jsonable(payload)
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=rid).first()
        if run is None:
            raise UnknownRunError(f"no run with id {rid}")
        if run.status in FINISHED or run.cancel_requested_at is not None:
            return Signaled(False, run.status)
        now = clock.now()
        Fact.objects.create(run=run, name=name, payload=data, created_at=now)
        if run.status == RunStatus.WAITING and run.waiting_on == f"fact:{name}":
            transitions.wake_run(run)
            notify.wake_workers(run.queue)
            return Signaled(True, RunStatus.PENDING)
        return Signaled(True, run.status)
