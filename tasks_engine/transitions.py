"""The only writer of run and step state.

Every write an attempt makes is a compare-and-set on its lease token: a statement that matches
no row means the attempt lost its lease, and raises `LeaseLostError`. On PostgreSQL the fence
takes a share lock on the run row, so a concurrent reclaim either waits for the write or makes
it fail; on SQLite each statement runs under the single writer lock.

Lock order: the run row first, then its step attempts.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from . import clock, notify
from .exceptions import LeaseLostError
from .models import Fact, StepAttempt, WorkflowRun
from .sql import (
    execute,
    fetchall,
    is_postgres,
    new_token_sql,
    p_dt,
    p_json,
    p_uuid,
    placeholders,
    r_uuid,
    share_lock,
    skip_locked,
)

RUN = WorkflowRun._meta.db_table
STEP = StepAttempt._meta.db_table
# Attempts that execute code; sleeps, fact waits and child waits are armed timers, not work.
WORK_KINDS = "('function', 'op')"


class DeferredCompletion:
    """A finished step whose checkpoint rides on the run's next write (group commit per run).

    A step's completion is not sent on its own: it goes in the same statement as the next
    step's start or the run's completion, halving the round trips of a workflow. Every other
    write of the attempt sends it first, and the heartbeat sends one that waited too long, so
    the window in which a crash loses a finished step's result (and the step runs again, as an
    interrupted step would) is the user code between two steps, at most about a second.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._item: tuple[int, Any, datetime] | None = None

    def put(self, step_id: int, output: Any) -> tuple[int, Any, datetime] | None:
        with self._lock:
            previous, self._item = self._item, (step_id, output, clock.now())
        return previous

    def take(self, older_than: float | None = None) -> tuple[int, Any, datetime] | None:
        with self._lock:
            item = self._item
            if item is None:
                return None
            if older_than is not None and (clock.now() - item[2]).total_seconds() < older_than:
                return None
            self._item = None
            return item


@dataclass(frozen=True)
class Lease:
    run_id: uuid.UUID
    token: uuid.UUID
    worker_id: str
    deferred: DeferredCompletion = field(default_factory=DeferredCompletion, compare=False)
    # A worker's group commit (worker/group_commit.py): the hot writes of all its slots share
    # statements and commits. None: every write goes on its own.
    group: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Claimed:
    lease: Lease
    run: WorkflowRun  # the row as the claim left it: no second read needed


@dataclass(frozen=True)
class Renewal:
    cancel_requested: bool
    deadline_passed: bool


def _fence() -> str:
    return (
        f"EXISTS (SELECT 1 FROM {RUN} WHERE id = %s AND lease_token = %s"
        f" AND status = 'running'{share_lock()})"
    )


def _fence_params(lease: Lease) -> list[Any]:
    return [p_uuid(lease.run_id), p_uuid(lease.token)]


def _filters(pairs: list[tuple[str, int]], queues: list[str] | None) -> tuple[str, list[Any]]:
    """Only the (name, version) pairs a worker registered, and its queues: one parameter each,
    so a worker with many workflows does not send (and parse) hundreds of parameters a claim."""
    keys = [f"{name}@{version}" for name, version in pairs]
    if is_postgres():
        sql = " AND task_name || '@' || version = ANY(%s)"
        params: list[Any] = [keys]
        if queues:
            sql += " AND queue = ANY(%s)"
            params.append(list(queues))
        return sql, params
    sql = " AND task_name || '@' || version IN (SELECT value FROM json_each(%s))"
    params = [json.dumps(keys)]
    if queues:
        sql += " AND queue IN (SELECT value FROM json_each(%s))"
        params.append(json.dumps(list(queues)))
    return sql, params


# -- creating ---------------------------------------------------------------------------------


def create_run(
    *,
    task_name: str,
    version: int,
    queue: str,
    priority: int,
    input: Any,
    idempotency_key: str | None,
    input_hash: str,
    trace_id: str,
    available_at: datetime | None,
    deadline_at: datetime | None,
    parent_run_id: uuid.UUID | None,
    parent_step: str,
) -> uuid.UUID | None:
    """Insert a pending run on the caller's connection (and transaction) in one statement,
    which on PostgreSQL also NOTIFYs idle workers (delivered at commit). With an idempotency
    key that is taken, nothing is inserted and None is returned."""
    now = clock.now()
    run_id = uuid.uuid4()
    conflict = (
        " ON CONFLICT (task_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
        if idempotency_key is not None
        else ""
    )
    sql = f"""
        INSERT INTO {RUN} (id, task_name, version, queue, status, priority, input,
            idempotency_key, input_hash, trace_id, attempts, failures, worker_id, available_at,
            waiting_on, deadline_at, cancel_reason, parent_run_id, parent_step, unreached_steps,
            created_at, updated_at)
        VALUES (%s, %s, %s, %s, 'pending', %s, %s, %s, %s, %s, 0, 0, '', %s, '', %s, '', %s, %s,
            '[]', %s, %s){conflict}
        RETURNING id
    """
    params: list[Any] = [p_uuid(run_id), task_name, version, queue, priority, p_json(input)]
    params += [idempotency_key, input_hash, trace_id, p_dt(available_at or now), p_dt(deadline_at)]
    params += [p_uuid(parent_run_id), parent_step, p_dt(now), p_dt(now)]
    if notify.enabled():
        sql = f"WITH created AS ({sql}) SELECT id, pg_notify(%s, %s) FROM created"
        params += [notify.CHANNEL, queue]
    rows = fetchall(sql, params)
    return run_id if rows else None


# -- claiming ---------------------------------------------------------------------------------


def claim_runs(
    worker_id: str,
    pairs: list[tuple[str, int]],
    queues: list[str] | None,
    limit: int,
    lease_seconds: float,
) -> list[Claimed]:
    """Claim up to `limit` runs: expired leases first, then due timers, then pending by priority.

    Each source reads its own partial index, so far-future sleepers and finished rows cost nothing.
    """
    if not pairs or limit <= 0:
        return []
    now = clock.now()
    filt, fparams = _filters(pairs, queues)
    lock = skip_locked()
    sql = f"""
        WITH expired AS (
            SELECT id, 0 AS src, priority, available_at FROM {RUN}
            WHERE status = 'running' AND available_at <= %s{filt}
            ORDER BY available_at LIMIT %s{lock}
        ), woken AS (
            SELECT id, 1 AS src, priority, available_at FROM {RUN}
            WHERE status = 'waiting' AND available_at <= %s{filt}
            ORDER BY available_at LIMIT %s{lock}
        ), due AS (
            SELECT id, 2 AS src, priority, available_at FROM {RUN}
            WHERE status = 'pending' AND available_at <= %s{filt}
            ORDER BY priority DESC, available_at LIMIT %s{lock}
        )
        UPDATE {RUN} SET status = 'running', lease_token = {new_token_sql()}, worker_id = %s,
            attempts = attempts + 1, available_at = %s, waiting_on = '',
            started_at = COALESCE(started_at, %s), updated_at = %s
        WHERE id IN (
            SELECT id FROM (
                SELECT * FROM expired UNION ALL SELECT * FROM woken UNION ALL SELECT * FROM due
            ) AS candidates ORDER BY src, priority DESC, available_at LIMIT %s
        )
        RETURNING {", ".join(_CLAIM_COLUMNS)}
    """
    t = p_dt(now)
    params = [t, *fparams, limit, t, *fparams, limit, t, *fparams, limit]
    params += [worker_id, p_dt(now + timedelta(seconds=lease_seconds)), t, t, limit]
    if is_postgres():
        runs = [_run_from_row(row) for row in fetchall(sql, params)]
    else:  # SQLite returns text for times and JSON: let Django convert them
        runs = list(WorkflowRun.objects.raw(sql, params))
    runs.sort(key=lambda r: (-r.priority, r.created_at))
    return [Claimed(Lease(r.pk, r_uuid(r.lease_token), worker_id), r) for r in runs]


# What the executor needs of a claimed run; the claim returns it, so nothing is read twice.
_CLAIM_COLUMNS = (
    "id",
    "task_name",
    "version",
    "queue",
    "status",
    "priority",
    "input",
    "trace_id",
    "attempts",
    "failures",
    "worker_id",
    "lease_token",
    "available_at",
    "deadline_at",
    "cancel_requested_at",
    "cancel_reason",
    "parent_run_id",
    "created_at",
    "started_at",
)
_JSON_COLUMNS = frozenset({"input"})


def _run_from_row(row: tuple[Any, ...]) -> WorkflowRun:
    values = [
        json.loads(v) if name in _JSON_COLUMNS and isinstance(v, str) else v
        for name, v in zip(_CLAIM_COLUMNS, row, strict=True)
    ]
    return WorkflowRun.from_db("default", list(_CLAIM_COLUMNS), values)


def anything_due_before(
    pairs: list[tuple[str, int]], queues: list[str] | None, horizon: datetime
) -> bool:
    """Whether a run this worker could claim becomes due before `horizon` (for --burst)."""
    if not pairs:
        return False
    filt, fparams = _filters(pairs, queues)
    sql = (
        f"SELECT 1 FROM {RUN} WHERE status IN ('pending', 'running', 'waiting')"
        f" AND available_at <= %s{filt} LIMIT 1"
    )
    return bool(fetchall(sql, [p_dt(horizon), *fparams]))


def renew_leases(leases: list[Lease], lease_seconds: float) -> dict[uuid.UUID, Renewal]:
    """One statement renews every lease a worker holds. Runs missing from the result are lost."""
    if not leases:
        return {}
    now = clock.now()
    n = len(leases)
    sql = f"""
        UPDATE {RUN} SET available_at = %s
        WHERE status = 'running' AND id IN ({placeholders(n)})
          AND lease_token IN ({placeholders(n)})
        RETURNING id, cancel_requested_at IS NOT NULL,
            CASE WHEN deadline_at IS NOT NULL AND deadline_at <= %s THEN 1 ELSE 0 END
    """
    params = [p_dt(now + timedelta(seconds=lease_seconds))]
    params += [p_uuid(x.run_id) for x in leases] + [p_uuid(x.token) for x in leases]
    params.append(p_dt(now))
    return {
        r_uuid(rid): Renewal(bool(cancel), bool(deadline))
        for rid, cancel, deadline in fetchall(sql, params)
    }


# -- steps ------------------------------------------------------------------------------------


def close_interrupted_attempts(lease: Lease) -> int:
    """On reclaim: attempts a crashed holder left `running` become `abandoned` (and count)."""
    sql = f"""
        UPDATE {STEP} SET status = 'abandoned', counted = TRUE, finished_at = %s
        WHERE run_id = %s AND status = 'running' AND kind IN {WORK_KINDS}
          AND (lease_token IS NULL OR lease_token <> %s) AND {_fence()}
    """
    now = p_dt(clock.now())
    return execute(sql, [now, p_uuid(lease.run_id), p_uuid(lease.token), *_fence_params(lease)])


def start_step(
    lease: Lease,
    name: str,
    kind: str,
    attempt: int,
    run_pass: int,
    *,
    status: str = "running",
    output: Any = None,
    error: Any = None,
    wake_at: datetime | None = None,
) -> int:
    now = clock.now()
    if lease.group is not None and kind == "function" and status == "running" and output is None:
        write = GroupWrite("start", lease, lease.deferred.take(), now, name, attempt, run_pass)
        return int(lease.group.submit(write))
    finished = p_dt(now) if status != "running" else None
    prefix, prefix_params = _with_deferred(lease)
    sql = f"""
        {prefix}
        INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted, output,
            error, worker_id, lease_token, wake_at, started_at, finished_at)
        SELECT %s, %s, %s, %s, %s, %s, TRUE, %s, %s, %s, %s, %s, %s, %s
        WHERE {_fence()}
        RETURNING id
    """
    params = [*prefix_params, p_uuid(lease.run_id), name, kind, status, attempt, run_pass]
    params += [p_json(output), p_json(error), lease.worker_id, p_uuid(lease.token), p_dt(wake_at)]
    params.append(p_dt(now))
    params.append(finished)
    rows = fetchall(sql, params + _fence_params(lease))
    if not rows:
        raise LeaseLostError(f"run {lease.run_id}: lease lost before step {name!r} started")
    return int(rows[0][0])


def defer_step_completion(lease: Lease, step_id: int, output: Any) -> None:
    """Record a step as completed with the run's next write (see DeferredCompletion)."""
    previous = lease.deferred.put(step_id, output)
    if previous is not None:
        _send_completion(lease, previous)


def flush_deferred(lease: Lease, older_than: float | None = None) -> None:
    """Send a deferred step completion now (before any write that cannot carry it)."""
    item = lease.deferred.take(older_than)
    if item is not None:
        _send_completion(lease, item)


def _send_completion(lease: Lease, item: tuple[int, Any, datetime]) -> None:
    step_id, output, finished_at = item
    sql = f"""
        UPDATE {STEP} SET status = 'completed', output = %s, finished_at = %s
        WHERE id = %s AND status = 'running' AND {_fence()}
    """
    params = [p_json(output), p_dt(finished_at), step_id, *_fence_params(lease)]
    if not execute(sql, params):
        raise LeaseLostError(f"run {lease.run_id}: lease lost before step {step_id} finished")


def _with_deferred(lease: Lease) -> tuple[str, list[Any]]:
    """A CTE that completes the deferred step inside the caller's statement (PostgreSQL), or
    nothing after sending it on its own (SQLite has no data-modifying CTEs)."""
    item = lease.deferred.take()
    if item is None:
        return "", []
    if not is_postgres():
        _send_completion(lease, item)
        return "", []
    step_id, output, finished_at = item
    sql = (
        f"WITH deferred AS (UPDATE {STEP} SET status = 'completed', output = %s,"
        f" finished_at = %s WHERE id = %s AND status = 'running' AND {_fence()} RETURNING id)"
    )
    return sql, [p_json(output), p_dt(finished_at), step_id, *_fence_params(lease)]


def finish_step(
    lease: Lease, step_id: int, status: str, *, output: Any = None, error: Any = None
) -> None:
    flush_deferred(lease)
    sql = f"""
        UPDATE {STEP} SET status = %s, output = %s, error = %s, finished_at = %s
        WHERE id = %s AND status = 'running' AND {_fence()}
    """
    params = [status, p_json(output), p_json(error), p_dt(clock.now()), step_id]
    if not execute(sql, params + _fence_params(lease)):
        raise LeaseLostError(f"run {lease.run_id}: lease lost before step {step_id} finished")


def _close_running_attempts(lease: Lease, *, counted: bool, work_only: bool = False) -> None:
    kinds = f" AND kind IN {WORK_KINDS}" if work_only else ""
    execute(
        f"UPDATE {STEP} SET status = 'abandoned', counted = %s, finished_at = %s"
        f" WHERE run_id = %s AND status = 'running'{kinds}",
        [counted, p_dt(clock.now()), p_uuid(lease.run_id)],
    )


# -- run outcomes -----------------------------------------------------------------------------


@contextmanager
def _no_transaction() -> Iterator[None]:
    yield


def _cas_run(lease: Lease, assignments: str, params: list[Any]) -> None:
    """Compare-and-set on the run row; carries a deferred step completion along."""
    prefix, prefix_params = _with_deferred(lease)
    # Referencing the CTE makes it run before this UPDATE touches the run row: its fence
    # could not lock a row version this same statement had already replaced.
    after_deferred = " AND (SELECT count(*) FROM deferred) >= 0" if prefix else ""
    sql = (
        f"{prefix} UPDATE {RUN} SET {assignments}, updated_at = %s"
        f" WHERE id = %s AND lease_token = %s AND status = 'running'{after_deferred}"
    )
    full = [*prefix_params, *params, p_dt(clock.now()), p_uuid(lease.run_id)]
    full.append(p_uuid(lease.token))
    if not execute(sql, full):
        raise LeaseLostError(f"run {lease.run_id}: lease lost")


def complete_run(
    lease: Lease,
    output: Any,
    unreached: list[str],
    *,
    has_parent: bool = False,
    progress: dict[str, Any] | None = None,
) -> None:
    """Running -> completed. The handler returned, so every attempt of this pass is closed.
    The last progress the handler reported (not yet flushed by the heartbeat) goes along."""
    if lease.group is not None and not has_parent:
        write = GroupWrite("complete", lease, lease.deferred.take(), clock.now())
        write.output, write.unreached, write.progress = output, unreached, progress
        lease.group.submit(write)
        return
    with transaction.atomic() if has_parent else _no_transaction():
        if has_parent:
            lock_parent(lease.run_id)
        _cas_run(
            lease,
            "status = 'completed', output = %s, unreached_steps = %s, finished_at = %s,"
            " lease_token = NULL, available_at = NULL, waiting_on = '', error = NULL,"
            " progress = COALESCE(%s, progress)",
            [p_json(output), p_json(unreached), p_dt(clock.now()), p_json(progress)],
        )
        if has_parent:
            wake_parent(lease.run_id)


def fail_run(lease: Lease, error: dict[str, Any], *, has_parent: bool = False) -> None:
    with transaction.atomic():
        if has_parent:
            lock_parent(lease.run_id)
        _cas_run(
            lease,
            "status = 'failed', error = %s, failures = failures + 1, finished_at = %s,"
            " lease_token = NULL, available_at = NULL, waiting_on = ''",
            [p_json(error), p_dt(clock.now())],
        )
        _close_running_attempts(lease, counted=False)
        if has_parent:
            wake_parent(lease.run_id)


def requeue_run(
    lease: Lease,
    available_at: datetime,
    *,
    error: dict[str, Any] | None = None,
    count_failure: bool = False,
    interrupted_count: bool = False,
    failed_step: tuple[int, dict[str, Any]] | None = None,
) -> None:
    """Back to `pending`: step retry backoff, workflow retry, or a graceful hand-back."""
    with transaction.atomic():
        _cas_run(
            lease,
            "status = 'pending', lease_token = NULL, available_at = %s, waiting_on = '',"
            " failures = failures + %s, error = COALESCE(%s, error)",
            [p_dt(available_at), 1 if count_failure else 0, p_json(error)],
        )
        if failed_step is not None:
            step_id, step_error = failed_step
            execute(
                f"UPDATE {STEP} SET status = 'failed', error = %s, finished_at = %s"
                f" WHERE id = %s AND status = 'running'",
                [p_json(step_error), p_dt(clock.now()), step_id],
            )
        _close_running_attempts(lease, counted=interrupted_count, work_only=True)


def park_run(lease: Lease, waiting_on: str, wake_at: datetime | None, deadline: datetime | None):
    """Running -> waiting. The wake time is capped by the deadline so the run fails on time."""
    if deadline is not None and (wake_at is None or deadline < wake_at):
        wake_at = deadline
    _cas_run(
        lease,
        "status = 'waiting', lease_token = NULL, available_at = %s, waiting_on = %s",
        [p_dt(wake_at), waiting_on],
    )


def cancel_running_run(lease: Lease, *, has_parent: bool = False) -> None:
    """The holder of a canceled run ends it and closes whatever attempt was in flight."""
    with transaction.atomic():
        if has_parent:
            lock_parent(lease.run_id)
        _cas_run(
            lease,
            "status = 'canceled', finished_at = %s, lease_token = NULL, available_at = NULL,"
            " waiting_on = ''",
            [p_dt(clock.now())],
        )
        _close_running_attempts(lease, counted=False)
        if has_parent:
            wake_parent(lease.run_id)


def cancel_idle_run(run: WorkflowRun, reason: str) -> None:
    """Pending or waiting -> canceled. The caller holds the run's row lock."""
    now = clock.now()
    WorkflowRun.objects.filter(pk=run.pk, status__in=["pending", "waiting"]).update(
        status="canceled",
        cancel_requested_at=run.cancel_requested_at or now,
        cancel_reason=reason,
        finished_at=now,
        updated_at=now,
        available_at=None,
        lease_token=None,
        waiting_on="",
    )
    StepAttempt.objects.filter(run_id=run.pk, status="running").update(
        status="abandoned", counted=False, finished_at=now
    )
    if run.parent_run_id is not None:
        wake_parent(run.pk)


def request_cancel(run: WorkflowRun, reason: str) -> None:
    """Running: record the request; the holder sees it at its next heartbeat (or NOTIFY)."""
    now = clock.now()
    WorkflowRun.objects.filter(pk=run.pk, cancel_requested_at__isnull=True).update(
        cancel_requested_at=now, cancel_reason=reason, updated_at=now
    )


def wake_run(run: WorkflowRun) -> None:
    """Waiting -> pending, due now (a fact or child result arrived). Caller holds the row lock."""
    now = clock.now()
    WorkflowRun.objects.filter(pk=run.pk, status="waiting").update(
        status="pending", available_at=now, waiting_on="", updated_at=now
    )


def set_progress(lease: Lease, progress: dict[str, Any]) -> None:
    WorkflowRun.objects.filter(pk=lease.run_id, lease_token=lease.token, status="running").update(
        progress=progress
    )


# -- waiting ----------------------------------------------------------------------------------


def lock_held_run(lease: Lease) -> bool:
    """Lock the run row if this attempt still holds it. Inside a transaction."""
    rows = fetchall(
        f"SELECT 1 FROM {RUN} WHERE id = %s AND lease_token = %s AND status = 'running'"
        + (" FOR UPDATE" if is_postgres() else ""),
        _fence_params(lease),
    )
    return bool(rows)


def take_fact(lease: Lease, step_id: int, key: str, fact_name: str) -> tuple[bool, Any]:
    """Consume the oldest fact of that name no earlier wait took, and complete the wait step.

    Returns (found, payload). One transaction: the fact, the step and the fence move together.
    """
    flush_deferred(lease)
    with transaction.atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost while waiting for a fact")
        fact = (
            Fact.objects.filter(run_id=lease.run_id, name=fact_name, consumed_by="")
            .order_by("id")
            .values_list("id", "payload")
            .first()
        )
        if fact is None:
            return False, None
        Fact.objects.filter(pk=fact[0]).update(consumed_by=key)
        finish_step(lease, step_id, "completed", output=fact[1])
        return True, fact[1]


def park_run_unless(
    lease: Lease,
    waiting_on: str,
    wake_at: datetime | None,
    deadline: datetime | None,
    arrived: Callable[[], bool],
) -> bool:
    """Running -> waiting, unless `arrived()` says the awaited thing came meanwhile.

    `arrived` runs under the run's row lock: a fact or child result that committed after the
    handler decided to park is seen here, and one that commits later finds the run waiting
    (signal and child completion lock the same row), so no wake-up is lost.
    """
    flush_deferred(lease)
    with transaction.atomic():
        if not lock_held_run(lease):
            raise LeaseLostError(f"run {lease.run_id}: lease lost before parking")
        if arrived():
            return False
        park_run(lease, waiting_on, wake_at, deadline)
        return True


def lock_parent(child_id: uuid.UUID) -> None:
    """Before a child's end is written: lock its parent's row, which a parent about to park
    on this child holds while it reads the child's status. Whichever takes the lock second
    sees the other's commit, so the parent either finds the child finished or gets woken.
    (Waking alone is not enough: an UPDATE that finds the parent still running locks nothing.)
    Lock order: parent before child, as cancel's cascade does."""
    if is_postgres():
        fetchall(
            f"SELECT 1 FROM {RUN} WHERE id = (SELECT parent_run_id FROM {RUN} WHERE id = %s)"
            " FOR UPDATE",
            [p_uuid(child_id)],
        )


def wake_parent(child_id: uuid.UUID) -> None:
    """A child finished: wake its parent if it waits on this child (same transaction)."""
    now = clock.now()
    rows = fetchall(
        f"UPDATE {RUN} SET status = 'pending', available_at = %s, waiting_on = '', updated_at = %s"
        f" WHERE id = (SELECT parent_run_id FROM {RUN} WHERE id = %s)"
        f" AND status = 'waiting' AND waiting_on = %s RETURNING queue",
        [p_dt(now), p_dt(now), p_uuid(child_id), f"child:{child_id}"],
    )
    for (queue,) in rows:
        notify.wake_workers(queue)


def fact_available(run_id: uuid.UUID, fact_name: str) -> bool:
    return Fact.objects.filter(run_id=run_id, name=fact_name, consumed_by="").exists()


def child_outcome(child_id: uuid.UUID) -> tuple[str, Any, Any]:
    row = WorkflowRun.objects.filter(pk=child_id).values_list("status", "output", "error").get()
    return row[0], row[1], row[2]


# -- group commit (PostgreSQL workers) ------------------------------------------------------


@dataclass
class GroupWrite:
    """One slot's hot write, sent with other slots' writes in one statement and one commit.

    `kind` is "start" (a function step's fenced INSERT; `result` becomes its id) or "complete"
    (the run's completion; `result` becomes True). Either carries the run's deferred step
    completion. A write whose fence fails gets `error = LeaseLostError`, like a direct write.
    """

    kind: str
    lease: Lease
    deferred: tuple[int, Any, datetime] | None
    at: datetime
    name: str = ""
    attempt: int = 0
    run_pass: int = 0
    output: Any = None
    unreached: list[str] = field(default_factory=list)
    progress: dict[str, Any] | None = None
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def write_group(writes: list[GroupWrite]) -> None:
    """Every write of the group in one statement: deferred completions first, then step
    starts, then run completions (which reference the first two so that their fences lock the
    run rows before this statement replaces them). Fills each write's result or error."""
    fence = (
        "EXISTS (SELECT 1 FROM {run} r WHERE r.id = {v}.run_id AND r.lease_token = {v}.token"
        " AND r.status = 'running' FOR SHARE)"
    )
    ctes: list[str] = []
    params: list[Any] = []
    deferred = [w for w in writes if w.deferred is not None]
    starts = [w for w in writes if w.kind == "start"]
    completes = [w for w in writes if w.kind == "complete"]
    if deferred:
        rows = ", ".join(
            ["(%s::bigint, %s::jsonb, %s::timestamptz, %s::uuid, %s::uuid)"] * len(deferred)
        )
        for w in deferred:
            assert w.deferred is not None
            step_id, output, finished_at = w.deferred
            params += [step_id, p_json(output), finished_at, w.lease.run_id, w.lease.token]
        ctes.append(f"dv (step_id, output, finished_at, run_id, token) AS (VALUES {rows})")
        ctes.append(
            f"d AS (UPDATE {STEP} s SET status = 'completed', output = dv.output,"
            f" finished_at = dv.finished_at FROM dv WHERE s.id = dv.step_id"
            f" AND s.status = 'running' AND {fence.format(run=RUN, v='dv')} RETURNING s.id)"
        )
    if starts:
        rows = ", ".join(
            ["(%s::uuid, %s::text, %s::int, %s::int, %s::text, %s::uuid, %s::timestamptz)"]
            * len(starts)
        )
        for w in starts:
            params += [w.lease.run_id, w.name, w.attempt, w.run_pass, w.lease.worker_id]
            params += [w.lease.token, w.at]
        ctes.append(
            f"sv (run_id, name, attempt, run_pass, worker_id, token, started_at) AS (VALUES {rows})"
        )
        ctes.append(
            f"i AS (INSERT INTO {STEP} (run_id, name, kind, status, attempt, run_pass, counted,"
            f" worker_id, lease_token, started_at) SELECT sv.run_id, sv.name, 'function',"
            f" 'running', sv.attempt, sv.run_pass, TRUE, sv.worker_id, sv.token, sv.started_at"
            f" FROM sv WHERE {fence.format(run=RUN, v='sv')} RETURNING id, run_id)"
        )
    if completes:
        rows = ", ".join(
            ["(%s::uuid, %s::uuid, %s::jsonb, %s::jsonb, %s::timestamptz, %s::jsonb)"]
            * len(completes)
        )
        for w in completes:
            params += [w.lease.run_id, w.lease.token, p_json(w.output), p_json(w.unreached)]
            params += [w.at, p_json(w.progress)]
        after = "".join(
            f" AND (SELECT count(*) FROM {name}) >= 0"
            for name, present in (("d", deferred), ("i", starts))
            if present
        )
        ctes.append(f"cv (run_id, token, output, unreached, at, progress) AS (VALUES {rows})")
        ctes.append(
            f"c AS (UPDATE {RUN} r SET status = 'completed', output = cv.output,"
            f" unreached_steps = cv.unreached, finished_at = cv.at, updated_at = cv.at,"
            f" lease_token = NULL, available_at = NULL, waiting_on = '', error = NULL,"
            f" progress = COALESCE(cv.progress, r.progress) FROM cv WHERE r.id = cv.run_id"
            f" AND r.lease_token = cv.token AND r.status = 'running'{after} RETURNING r.id)"
        )
    selects = []
    if starts:
        selects.append("SELECT 'i', i.id, i.run_id FROM i")
    if completes:
        selects.append("SELECT 'c', NULL::bigint, c.id FROM c")
    if not selects:  # only deferred completions
        selects.append("SELECT 'd', d.id, NULL::uuid FROM d")
    sql = "WITH " + ", ".join(ctes) + " " + " UNION ALL ".join(selects)
    started: dict[uuid.UUID, int] = {}
    completed: set[uuid.UUID] = set()
    for tag, step_id, run_id in fetchall(sql, params):
        if tag == "i":
            started[r_uuid(run_id)] = int(step_id)
        elif tag == "c":
            completed.add(r_uuid(run_id))
    for w in writes:
        if w.kind == "start" and w.lease.run_id in started:
            w.result = started[w.lease.run_id]
        elif w.kind == "complete" and w.lease.run_id in completed:
            w.result = True
        elif w.kind in ("start", "complete"):
            w.error = LeaseLostError(f"run {w.lease.run_id}: lease lost")
