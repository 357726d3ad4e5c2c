"""The engine API: enqueue, signal, cancel, retry_run, get_run, list_runs, wait. Thin;
transitions do the writes."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
from pydantic_core import InitErrorDetails, PydanticCustomError

from . import transitions
from .db import notify
from .db.alias import atomic
from .db.sql import is_postgres
from .definitions import Workflow, check_priority, is_integer, registry
from .exceptions import UnknownRunError, UnknownStepError
from .models import Fact, StepAttempt, WorkflowRun
from .observe import tracing
from .run_waiter import wait_finished
from .states import FINISHED, RunStatus
from .transitions import enqueueing
from .values import tags as run_tags
from .values.serialization import check_reason, input_hash, plain_stored, to_jsonable
from .values.text import check_text


@dataclass(frozen=True)
class Enqueued:
    run_id: uuid.UUID
    deduplicated: bool


@dataclass(frozen=True)
class Signaled:
    delivered: bool
    status: str

    def __post_init__(self) -> None:  # a RunStatus member or its value: always the plain value
        object.__setattr__(self, "status", str(self.status))


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
    superseded: bool = False  # set aside by retry_run(from_step=...): history, not replayed


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
    queueing_key: str | None = None
    debounce_key: str | None = None
    rate_key: str | None = None
    waiting_on: str = ""
    retries: list[dict[str, Any]] = field(default_factory=list)  # retry_run: at, by, reason
    tags: dict[str, str] = field(default_factory=dict)
    steps: list[StepView] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """Completed, failed or canceled: nothing more happens to the run unless it is retried."""
        return self.status in FINISHED

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
        trace_id=tracing.run_trace_id(run.trace_id, run.pk),
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
        queueing_key=run.queueing_key,
        debounce_key=run.debounce_key,
        rate_key=run.rate_key,
        waiting_on=run.waiting_on,
        retries=list(run.retries or []),
        tags=dict(run.tags or {}),
        steps=steps or [],
    )


# The longest values the run and fact columns hold (SQLite would store longer ones, PostgreSQL
# refuses them with a DataError): refused up front, with the argument named, on both.
_COLUMNS = {
    "queue": (WorkflowRun, "queue"),
    "idempotency_key": (WorkflowRun, "idempotency_key"),
    "concurrency_key": (WorkflowRun, "concurrency_key"),
    "queueing_key": (WorkflowRun, "queueing_key"),
    "debounce_key": (WorkflowRun, "debounce_key"),
    "rate_limit_key": (WorkflowRun, "rate_key"),
    "trace_id": (WorkflowRun, "trace_id"),
    "fact name": (Fact, "name"),
}
_LONGEST: dict[str, int] = {
    what: int(getattr(model._meta.get_field(f), "max_length", 0) or 0)
    for what, (model, f) in _COLUMNS.items()
}


def _check_text(what: str, value: Any) -> None:
    """ValueError (a wrong type too: enqueue's and signal's contract) unless `value` fits."""
    check_text(what, value, _LONGEST[what], not_a_string=ValueError)


def check_time(what: str, value: Any) -> None:
    """TypeError unless a datetime; ValueError unless timezone-aware (a naive one would be
    read in the server's zone, with only a RuntimeWarning from Django)."""
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {value!r}")
    if value.utcoffset() is None:
        raise ValueError(
            f"{what} must be timezone-aware (datetime.now(UTC), django.utils.timezone.now()),"
            f" got {value!r}"
        )
    if (problem := utc_range_problem(what, value)) is not None:
        raise ValueError(problem)


def utc_range_problem(what: str, value: datetime) -> str | None:
    """Why an aware datetime cannot be stored, or None: outside Python's years 1-9999 once in
    UTC. PostgreSQL stores year 10000 (9999-12-31 23:00-05:00, say) but no read of that row
    can return it (psycopg: "timestamp too large"); SQLite's adapter overflows at once."""
    try:
        value.astimezone(UTC)
    except OverflowError:
        return f"{what} is out of range: {value!r} is outside years 1-9999 in UTC"
    return None


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
    concurrency_limit: int | None = None,
    queueing_key: str | None = None,
    debounce_key: str | None = None,
    parent_run_id: uuid.UUID | None = None,
    parent_step: str = "",
    tags: dict[str, str] | None = None,
) -> Enqueued:
    """Create a run on the caller's connection: it commits or rolls back with the caller.
    `concurrency_key` and `concurrency_limit` override the workflow's, as `queueing_key` does
    (docs/FLOW_CONTROL.md). With a queueing key that a queued run holds (pending, never
    started), that run is the answer (`deduplicated=True`) and nothing is written. With a
    debounce key (the workflow's `debounce_key`, or this one) whose window's run is still
    queued, that run is the answer and takes this input and a later due time. `tags` go
    over the workflow's own; a child run (`parent_run_id`) also carries its parent's."""
    wf = _workflow(task, version)
    data = wf.validate_input(input)  # pydantic.ValidationError: nothing written
    options = _options(
        wf,
        queue=queue,
        priority=priority,
        available_at=available_at,
        deadline_at=deadline_at,
        trace_id=trace_id,
        tags=tags,
        parent_run_id=parent_run_id,
    )
    run = _new_run(
        wf,
        data,
        options,
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit,
        queueing_key=queueing_key,
        debounce_key=debounce_key,
    )
    run.parent_run_id, run.parent_step = parent_run_id, parent_step
    [(run_id, deduplicated)] = enqueueing.answer(wf.name, [run])
    return Enqueued(run_id, deduplicated)


def enqueue_many(
    task: str | Workflow,
    inputs: Iterable[Any],
    *,
    queue: str | None = None,
    priority: int | None = None,
    idempotency_keys: Sequence[str | None] | None = None,
    available_at: datetime | None = None,
    tags: dict[str, str] | None = None,
) -> list[Enqueued]:
    """Create a run per input, in a few statements, on the caller's connection (inside its
    transaction if any), and answer each as `enqueue` would, in order. All or nothing: an
    invalid input raises `pydantic.ValidationError` naming its index, an idempotency key taken
    with another input `IdempotencyConflict`, and nothing is written."""
    wf = _workflow(task, None)
    if isinstance(inputs, str | bytes | dict) or not isinstance(inputs, Iterable):
        raise TypeError(f"inputs must be a list of inputs, not {type(inputs).__name__}")
    items = list(inputs)
    keys = _idempotency_keys(idempotency_keys, len(items))
    options = _options(wf, queue=queue, priority=priority, available_at=available_at, tags=tags)
    stored = _validated(wf, items)  # pydantic.ValidationError: nothing written
    runs = _new_items(wf, stored, options, keys)
    if not runs:
        return []
    answers = enqueueing.answer(wf.name, runs)  # all or none
    return [Enqueued(run_id, deduplicated) for run_id, deduplicated in answers]


def _workflow(task: str | Workflow, version: int | None) -> Workflow:
    if version is not None and not is_integer(version):
        # "1" was looked up as "unknown task a@1" beside a registered a@1; True and 1.0 ran as 1
        raise TypeError(f"version must be an integer, not {version!r}")
    if isinstance(task, Workflow):
        version = task.version if version is None else version
        task = task.name
    return registry.get(task, version)


def _options(
    wf: Workflow,
    *,
    queue: str | None,
    priority: int | None,
    available_at: datetime | None,
    deadline_at: datetime | None = None,
    trace_id: str | None = None,
    tags: dict[str, str] | None = None,
    parent_run_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """The columns an enqueue gives all its runs, checked (ValueError, TypeError)."""
    for what, value in (("queue", queue), ("trace_id", trace_id or None)):  # "": a new one
        if value is not None:
            _check_text(what, value)
    if priority is not None:
        check_priority(priority)
    for what, when in (("available_at", available_at), ("deadline_at", deadline_at)):
        if when is not None:
            check_time(what, when)
    own = run_tags.check_tags(tags)
    inherited = _parent_tags(parent_run_id) if parent_run_id is not None else {}
    return {
        "queue": wf.queue if queue is None else queue,
        "priority": wf.priority if priority is None else priority,
        "trace_id": trace_id or tracing.new_trace_id(),
        "available_at": available_at,
        "deadline_at": deadline_at,
        "deadline_after": wf.deadline,  # without deadline_at: created + the workflow's
        "tags": run_tags.merged({**wf.tags, **inherited}, own) or None,
    }


def _parent_tags(parent_run_id: uuid.UUID) -> dict[str, str]:
    """A child carries its parent's tags (over its workflow's defaults)."""
    found = WorkflowRun.objects.filter(pk=parent_run_id).values_list("tags", flat=True).first()
    return dict(found or {})


def _new_run(
    wf: Workflow,
    data: Any,
    options: dict[str, Any],
    *,
    idempotency_key: str | None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    queueing_key: str | None = None,
    debounce_key: str | None = None,
    digest: str | None = None,
) -> transitions.NewRun:
    """One run of `wf` with its validated input `data` (`digest`: its input hash, if known),
    its keys checked (ValueError; the input's size and depth: UnstorableValueError)."""
    key = wf.key_for(data, concurrency_key)  # ValueError: nothing written
    limit = wf.limit_for(key, concurrency_limit)
    queueing = wf.queueing_key_for(data, queueing_key)  # ValueError: nothing written
    debounced = wf.debounce_key_for(data, debounce_key)
    rate_key = wf.rate_key_for(data)
    for what, value in (
        ("idempotency_key", idempotency_key),
        ("concurrency_key", key),
        ("queueing_key", queueing),
        ("debounce_key", debounced),
        ("rate_limit_key", rate_key),
    ):
        if value is not None:
            _check_text(what, value)
    _check_key_combination(wf, options, key, queueing, debounced, rate_key)
    return transitions.NewRun(
        task_name=wf.name,
        version=wf.version,
        input=data,
        input_hash=digest or input_hash(data, f"the input of {wf.key}"),
        idempotency_key=idempotency_key,
        concurrency_key=key,
        concurrency_limit=limit,
        queueing_key=queueing,
        debounce_key=debounced,
        debounce=wf.debounce if debounced is not None else None,
        debounce_max=wf.debounce_max if debounced is not None else None,
        on_limit=wf.on_limit,
        rate_key=rate_key,
        rate_limit=(wf.rate_limit or "") if rate_key is not None else "",
        **options,
    )


def _check_key_combination(
    wf: Workflow,
    options: dict[str, Any],
    key: str | None,
    queueing: str | None,
    debounced: str | None,
    rate_key: str | None,
) -> None:
    """Keys that cannot apply to one run together: ValueError, nothing written."""
    if debounced is not None and queueing is not None:
        raise ValueError(
            f"debounce_key and queueing_key cannot both apply to a run of {wf.key}: use one"
        )
    if debounced is not None and options.get("available_at") is not None:
        raise ValueError(
            f"available_at cannot be given to a debounced run of {wf.key}: it is due"
            " debounce after its window's last enqueue"
        )
    if rate_key is not None and key is not None:
        raise ValueError(
            f"concurrency_key cannot be given to a run of {wf.key}, which has a"
            " rate_limit_key: a run is claimed under one kind of key"
        )


# An input validated: (stored form, its canonical JSON text, its input hash), the last two
# None when not known yet.
Stored = tuple[Any, str | None, str | None]


def _validated(wf: Workflow, items: list[Any]) -> list[Stored]:
    """Every input validated; the errors of all the bad ones in one `pydantic.ValidationError`
    whose locations start with the input's index. Without an input model, an input made of
    JSON's own types is checked, stored and hashed in one pass (`plain_stored`)."""
    stored: list[Stored] = []
    errors: list[InitErrorDetails] = []
    plain = wf.input_model is None
    for i, item in enumerate(items):
        if plain and (found := plain_stored(item if item is not None else {})) is not None:
            stored.append(found)
            continue
        try:
            stored.append((wf.validate_input(item), None, None))
        except pydantic.ValidationError as exc:
            errors += [
                {
                    "type": PydanticCustomError(e["type"], "{message}", {"message": e["msg"]}),
                    "loc": (i, *e["loc"]),
                    "input": e["input"],
                }
                for e in exc.errors(include_url=False)
            ]
    if errors:
        raise pydantic.ValidationError.from_exception_data(f"inputs of {wf.key}", errors)
    return stored


def _new_item(
    wf: Workflow, index: int, item: Stored, options: dict[str, Any], key: str | None
) -> transitions.NewRun:
    """`_new_run` for the input at `index` of enqueue_many: its errors name the index."""
    data, text, digest = item
    try:
        run = _new_run(wf, data, options, idempotency_key=key, digest=digest)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"inputs[{index}]: {exc}") from exc
    run.input_json = text
    return run


# What differs between the runs of one enqueue_many when its workflow's keys are not
# callables: the rest is the first run's.
_PER_RUN = frozenset({"id", "input", "input_hash", "input_json", "idempotency_key"})


def _new_items(
    wf: Workflow, stored: list[Stored], options: dict[str, Any], keys: list[str | None]
) -> list[transitions.NewRun]:
    """The runs of enqueue_many. When none of the workflow's keys is a callable of the input,
    the keys, their checks and every other column are the same for every run: found once,
    with the first run, and each further run takes only its input, hash and idempotency key."""
    if not stored:
        return []
    declared = (wf.concurrency_key, wf.queueing_key, wf.debounce_key, wf.rate_limit_key)
    if any(callable(d) for d in declared):
        return [_new_item(wf, i, item, options, keys[i]) for i, item in enumerate(stored)]
    first = _new_item(wf, 0, stored[0], options, keys[0])
    common = {f: v for f, v in vars(first).items() if f not in _PER_RUN}
    runs = [first]
    new_run = transitions.NewRun
    for i in range(1, len(stored)):
        data, text, digest = stored[i]
        key = keys[i]
        if key is not None or digest is None:
            try:
                if key is not None:
                    _check_text("idempotency_key", key)
                digest = digest or input_hash(data, f"the input of {wf.key}")
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"inputs[{i}]: {exc}") from exc
        runs.append(
            new_run(input=data, input_hash=digest, input_json=text, idempotency_key=key, **common)
        )
    return runs


def _idempotency_keys(keys: Sequence[str | None] | None, count: int) -> list[str | None]:
    if keys is None:
        return [None] * count
    if isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
        raise TypeError(f"idempotency_keys must be a list, not {type(keys).__name__}")
    if len(keys) != count:
        raise ValueError(f"idempotency_keys has {len(keys)} keys for {count} inputs")
    return list(keys)


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
            s.name,
            s.kind,
            s.status,
            s.attempt,
            s.output,
            s.error,
            s.started_at,
            s.finished_at,
            s.superseded,
        )
        for s in StepAttempt.objects.filter(run_id=rid).order_by("id")
    ]
    return _view(run, steps)


LIMIT_MAX = 2**63 - 1


def list_runs(
    *,
    task: str | None = None,
    status: str | None = None,
    version: int | None = None,
    tags: dict[str, str] | None = None,
    limit: int = 50,
) -> list[RunView]:
    """The newest runs first, at most `limit`; with `tags`, those that carry every pair."""
    if status is not None and status not in RunStatus.values:
        raise ValueError(f"unknown status {status!r}; one of {', '.join(RunStatus.values)}")
    if version is not None and not is_integer(version):
        raise ValueError(f"version must be an integer, not {version!r}")
    if not is_integer(limit):  # "5" and 2.7 were cut to 5 and 2 by int()
        raise ValueError(f"limit must be an integer, not {limit!r}")
    qs = WorkflowRun.objects.all().order_by("-created_at")
    if task is not None:
        qs = qs.filter(task_name=task)
    if version is not None:
        qs = qs.filter(version=version)
    if status is not None:
        qs = qs.filter(status=status)
    qs = run_tags.with_tags(qs, run_tags.check_tags(tags), postgres=is_postgres())
    # A LIMIT past the 64-bit range is refused by both databases (bigint out of range); no
    # table holds that many runs, so it means "all" as the largest one the statement takes.
    return [_view(run) for run in qs[: min(max(limit, 0), LIMIT_MAX)]]


def cancel(run_id: uuid.UUID | str, reason: str | None = None) -> bool:
    """Cancel a run and its children. False when the run had already finished."""
    rid = _run_id(run_id)
    check_reason(reason)
    with atomic():
        transitions.lock_parent(rid)  # a parent parking on this run must see the cancel
        run = WorkflowRun.objects.select_for_update().filter(pk=rid).first()
        if run is None:
            raise UnknownRunError(f"no run with id {rid}")
        if run.status in FINISHED:
            return False
        transitions.cancel_active(run, reason or "")
    return True


def retry_run(
    run_id: uuid.UUID | str,
    *,
    from_step: str | None = None,
    reason: str | None = None,
    by: str = "",
) -> bool:
    """Send a failed or canceled run back to `pending` for a fresh pass (same id and key).

    Completed steps are not run again; with `from_step`, that step and every step recorded
    after it are (their old attempts are kept, marked superseded). False, and nothing
    changes, for any other status, and for a child run whose parent has finished (retry the
    parent: its fresh pass starts the child again); `retry_refusal` says why. `by` names who
    retried, for the run's retry history.
    Raises `UnknownRunError`, or `UnknownStepError` for a `from_step` the run never recorded.
    """
    rid = _run_id(run_id)
    check_reason(reason)
    if from_step is not None and (
        not isinstance(from_step, str) or not from_step or "\x00" in from_step
    ):  # a NUL would fail the lookup's statement on PostgreSQL: no step has one
        raise UnknownStepError(f"from_step must be a step name, not {from_step!r}")
    return transitions.retry_run(rid, from_step=from_step, reason=reason or "", by=by)


def retry_refusal(run_id: uuid.UUID | str) -> str | None:
    """Why `retry_run` would refuse the run as it is now (one line), or None if it would not.
    Raises `UnknownRunError`."""
    return transitions.retry_refusal(_run_id(run_id))


def signal(
    run_id: uuid.UUID | str,
    name: str,
    payload: Any = None,
    *,
    idempotency_key: str | None = None,
) -> Signaled:
    """Store a fact for the run and wake it if it waits on that name.

    With `idempotency_key`, the same key for the same run stores one fact however often it is
    sent, and every repeat answers as the first signal did, even with another payload (the
    first payload is the one kept) and even after the run has finished.
    """
    rid = _run_id(run_id)
    _check_text("fact name", name)
    if idempotency_key is not None:
        _check_text("idempotency_key", idempotency_key)
    with atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=rid).first()
        if run is None:
            raise UnknownRunError(f"no run with id {rid}")
        data = to_jsonable(payload)  # UnstorableValueError: nothing written
        if idempotency_key is not None and (first := _first_answer(rid, idempotency_key)):
            return first
        if run.status in FINISHED or run.cancel_requested_at is not None:
            return Signaled(False, run.status)
        wakes = run.status == RunStatus.WAITING and run.waiting_on == f"fact:{name}"
        answer = Signaled(True, RunStatus.PENDING if wakes else run.status)
        if not transitions.store_fact(run, name, data, idempotency_key, answer.status):
            # A concurrent signal with the same key stored it first (SQLite has no row lock).
            first = _first_answer(rid, idempotency_key)
            assert first is not None
            return first
        if wakes:
            transitions.wake_run(run)
            notify.wake_workers(run.queue)
        return answer


def _first_answer(run_id: uuid.UUID, key: str | None) -> Signaled | None:
    status = (
        Fact.objects.filter(run_id=run_id, idempotency_key=key)
        .values_list("answered_status", flat=True)
        .first()
    )
    return None if status is None else Signaled(True, status)


def wait(run_id: uuid.UUID | str, timeout: float | timedelta | None = None) -> RunView:
    """Block until the run has finished (completed, failed or canceled) and return its view.
    Raises `TimeoutError` after `timeout` (seconds or a timedelta), `UnknownRunError` for an
    unknown id."""
    rid = _run_id(run_id)
    wait_finished(rid, timeout)
    view = get_run(rid)
    if view is None:  # pruned the moment it finished
        raise UnknownRunError(f"no run with id {rid}")
    return view
